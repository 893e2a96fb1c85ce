package framecodec

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// ErrMalformed is the error (wrapped) of a message that is not valid
// protobuf, or whose sizes exceed this package's limits.
var ErrMalformed = errors.New("framecodec: malformed message")

// Cursor reads protobuf wire data across the pieces of a
// mem.BufferSlice (gRPC's receive buffers) without copying them into one
// buffer.
type Cursor struct {
	s   mem.BufferSlice
	i   int // current piece
	off int // offset in the current piece
	n   int // bytes left in total
	err error
}

// NewCursor reads s from its start.
func NewCursor(s mem.BufferSlice) Cursor { return Cursor{s: s, n: s.Len()} }

// Len is the number of bytes left.
func (c *Cursor) Len() int { return c.n }

// Err is the first error the cursor met (the cursor is then empty).
func (c *Cursor) Err() error { return c.err }

func (c *Cursor) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.n = 0
}

func (c *Cursor) byte() byte {
	for c.n > 0 && c.i < len(c.s) {
		d := c.s[c.i].ReadOnlyData()
		if c.off < len(d) {
			b := d[c.off]
			c.off++
			c.n--
			return b
		}
		c.i, c.off = c.i+1, 0
	}
	c.fail(io.ErrUnexpectedEOF)
	return 0
}

// read fills dst from the next len(dst) bytes.
func (c *Cursor) read(dst []byte) {
	for len(dst) > 0 {
		if c.n <= 0 || c.i >= len(c.s) {
			c.fail(io.ErrUnexpectedEOF)
			clear(dst)
			return
		}
		d := c.s[c.i].ReadOnlyData()[c.off:]
		k := copy(dst, d)
		dst, c.off, c.n = dst[k:], c.off+k, c.n-k
		if k == len(d) {
			c.i, c.off = c.i+1, 0
		}
	}
}

// appendN appends the next k bytes to b.
func (c *Cursor) appendN(b []byte, k int) []byte {
	for k > 0 {
		if c.n <= 0 || c.i >= len(c.s) {
			c.fail(io.ErrUnexpectedEOF)
			return b
		}
		d := c.s[c.i].ReadOnlyData()[c.off:]
		m := min(k, len(d))
		b = append(b, d[:m]...)
		k, c.off, c.n = k-m, c.off+m, c.n-m
		if m == len(d) {
			c.i, c.off = c.i+1, 0
		}
	}
	return b
}

func (c *Cursor) discard(k int) {
	for k > 0 {
		if c.n <= 0 || c.i >= len(c.s) {
			c.fail(io.ErrUnexpectedEOF)
			return
		}
		d := len(c.s[c.i].ReadOnlyData()) - c.off
		m := min(k, d)
		k, c.off, c.n = k-m, c.off+m, c.n-m
		if m == d {
			c.i, c.off = c.i+1, 0
		}
	}
}

func (c *Cursor) varint() uint64 {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b := c.byte()
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	c.fail(ErrMalformed)
	return 0
}

func (c *Cursor) fixed32() uint32 {
	var b [4]byte
	c.read(b[:])
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func (c *Cursor) tag() (protowire.Number, protowire.Type) {
	num, typ := protowire.DecodeTag(c.varint())
	if num <= 0 {
		c.fail(ErrMalformed)
	}
	return num, typ
}

// length reads a length prefix that must fit in the bytes left before
// end (the bytes the cursor must keep for what follows) and below limit.
func (c *Cursor) length(end int, limit uint64) (int, bool) {
	l := c.varint()
	if c.err != nil {
		return 0, false
	}
	if l > uint64(c.n-end) || l > limit {
		if l <= uint64(c.n-end) {
			c.fail(fmt.Errorf("%w: a field of %d bytes; at most %d allowed", ErrMalformed, l, limit))
		} else {
			c.fail(ErrMalformed)
		}
		return 0, false
	}
	return int(l), true
}

func (c *Cursor) skip(typ protowire.Type) {
	switch typ {
	case protowire.VarintType:
		c.varint()
	case protowire.Fixed32Type:
		c.discard(4)
	case protowire.Fixed64Type:
		c.discard(8)
	case protowire.BytesType:
		l := c.varint()
		if l > uint64(c.n) {
			c.fail(ErrMalformed)
			return
		}
		c.discard(int(l))
	default:
		c.fail(fmt.Errorf("%w: unsupported wire type %d", ErrMalformed, typ))
	}
}
