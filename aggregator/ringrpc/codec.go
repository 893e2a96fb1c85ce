package ringrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"

	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/fsum"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// codecName is the content subtype of streams between rings
// ("application/grpc+gradsyncframes"). The bytes on the wire are exactly
// pb.SendFramesRequest's protobuf encoding; only the Go side differs.
const codecName = "gradsyncframes"

func init() { encoding.RegisterCodecV2(codec{}) }

// codec encodes *outFrame and decodes into *inFrame without the generic
// proto machinery (no intermediate []byte per frame, no float conversion on
// little-endian machines); every other message goes to the proto codec.
type codec struct{}

func (codec) Name() string { return codecName }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	o, ok := v.(*outFrame)
	if !ok {
		return protoCodec().Marshal(v)
	}
	return o.marshal(), nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	in, ok := v.(*inFrame)
	if !ok {
		return protoCodec().Unmarshal(data, v)
	}
	if err := in.decode(data); err != nil {
		in.raw = nil
		return err
	}
	if in.raw != nil {
		// The values stay in gRPC's receive buffers until they are
		// combined into the collective's buffer (or copied out for
		// RecvLeft); gRPC frees data when Unmarshal returns.
		in.raw.Ref()
	}
	return nil
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(encproto.Name) }

// outFrame is one SendFramesRequest on its way out, encoded without
// copying its data: Marshal hands gRPC the encoded tag fields followed by
// the caller's float32 values themselves (viewed as little-endian bytes;
// converted on big-endian machines). The data buffer is reference counted
// by gRPC with outFrame as its mem.BufferPool, so Put tells when gRPC has
// written every byte and the caller's slice may be reused: SendRight waits
// for that before it returns.
type outFrame struct {
	hdr  []byte // the message's bytes before the values; reused
	tags []byte // scratch for the TensorFrame's tag fields
	data []byte // the values' bytes: aliases the caller's []float32 on little-endian machines
	// state moves from outQueued to outSending (the sender goroutine
	// passed it to gRPC) or to outAbandoned (SendRight gave up first).
	state atomic.Int32
	// released receives one value when gRPC is done with data (Put).
	released chan struct{}
}

// States of an outFrame.
const (
	outQueued int32 = iota
	outSending
	outAbandoned
)

func newOutFrame() *outFrame { return &outFrame{released: make(chan struct{}, 1)} }

// Get implements mem.BufferPool; gRPC only Puts our buffers back.
func (o *outFrame) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put implements mem.BufferPool: gRPC is done with o.data.
func (o *outFrame) Put(*[]byte) { o.released <- struct{}{} }

// encode prepares f as a SendFramesRequest: the outer key and length and
// the TensorFrame's tag fields go to o.hdr, and o.data views f.Data, which
// must stay unchanged until gRPC is done with it.
//
// The data field's length is written with 0–3 redundant varint bytes (a
// valid protobuf encoding that every parser reads as the same number) so
// that the values start 4-byte aligned after gRPC's 5-byte message prefix:
// the receiver then finds them aligned in its 16 KiB frame buffers and
// sums them as float32 directly.
func (o *outFrame) encode(job string, rank int, f aggregator.Frame) {
	o.tags = appendTags(o.tags[:0], job, rank, f)
	nb := 4 * len(f.Data)
	var h []byte
	for pad := 0; pad < 4; pad++ {
		inner := len(o.tags)
		if nb > 0 {
			inner += protowire.SizeTag(10) + protowire.SizeVarint(uint64(nb)) + pad + nb
		}
		h = protowire.AppendTag(o.hdr[:0], 1, protowire.BytesType)
		h = protowire.AppendVarint(h, uint64(inner))
		h = append(h, o.tags...)
		if nb == 0 {
			break
		}
		h = protowire.AppendTag(h, 10, protowire.BytesType)
		h = appendPaddedVarint(h, uint64(nb), pad)
		if (grpcPrefix+len(h))%4 == 0 {
			break
		}
	}
	o.hdr = h
	o.data = f32Wire(o.data, f.Data)
}

// grpcPrefix is the length of gRPC's message prefix (compression flag and
// length) in front of every message on the wire.
const grpcPrefix = 5

// appendPaddedVarint appends v as a varint that is pad bytes longer than
// the shortest encoding (continuation bits over zero groups).
func appendPaddedVarint(b []byte, v uint64, pad int) []byte {
	n := protowire.SizeVarint(v) + pad
	for range n - 1 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendTags appends f's tag fields of a TensorFrame (job and sender
// rank included) to b.
func appendTags(b []byte, job string, rank int, f aggregator.Frame) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, job)
	b = appendVarintField(b, 2, f.Generation)
	b = appendVarintField(b, 3, uint64(opToPB(f.Op)))
	b = appendVarintField(b, 4, uint64(f.Step))
	b = appendVarintField(b, 5, uint64(f.Phase))
	b = appendVarintField(b, 6, uint64(f.Chunk))
	b = appendVarintField(b, 7, uint64(f.Offset))
	b = appendVarintField(b, 9, uint64(pb.DType_D_TYPE_F32))
	b = appendVarintField(b, 12, uint64(int64(rank)))
	return b
}

// marshal returns the encoded message for gRPC. A data buffer too small
// for gRPC's reference counting is copied (gRPC would not Put it), and
// released is signalled at once.
func (o *outFrame) marshal() mem.BufferSlice {
	hdr := mem.SliceBuffer(bytes.Clone(o.hdr))
	if len(o.data) == 0 {
		o.released <- struct{}{}
		return mem.BufferSlice{hdr}
	}
	b := mem.NewBuffer(&o.data, o)
	if _, plain := b.(mem.SliceBuffer); plain {
		b = mem.SliceBuffer(bytes.Clone(o.data))
		o.released <- struct{}{}
	}
	return mem.BufferSlice{hdr, b}
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // proto3: defaults are not sent
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// inFrame is one received frame: its tags and its data decoded into a
// buffer that is reused from frame to frame.
type inFrame struct {
	job     []byte // reused; compared with the ring's job id without allocating
	gen     uint64
	op      pb.Op
	step    int64
	phase   uint32
	chunk   uint32
	offset  uint64
	dtype   pb.DType
	rank    int32
	nbytes  int // length of the data field in bytes
	hasData bool
	// The values are either still in gRPC's receive buffers (raw, from
	// piece rawAt.i at byte rawAt.off on; raw holds a reference that
	// release drops) or decoded into data (store[:nbytes/4]).
	raw   mem.BufferSlice
	rawAt cursor
	data  []float32
	store []float32 // backing array of data, grown as needed
}

func (in *inFrame) reset() {
	*in = inFrame{job: in.job[:0], store: in.store}
}

// release drops in's reference to gRPC's receive buffers, if it holds one.
func (in *inFrame) release() {
	if in.raw != nil {
		in.raw.Free()
		in.raw = nil
	}
}

// tags is the aggregator view of in without its data.
func (in *inFrame) tags() aggregator.Frame {
	return aggregator.Frame{
		Generation: in.gen, Op: opFromPB(in.op), Step: in.step, Phase: in.phase,
		Chunk: in.chunk, Offset: int(in.offset),
	}
}

// frame is the aggregator view of in; Data aliases in's buffer. It
// decodes the values if they are still in gRPC's buffers.
func (in *inFrame) frame() aggregator.Frame {
	f := in.tags()
	if in.raw != nil && in.nbytes%4 == 0 {
		in.data = in.dataBuf(in.nbytes / 4)
		c := in.rawAt
		readF32(&c, in.data)
		in.release()
	}
	f.Data = in.data
	return f
}

// combineInto adds in's values to dst (add) or copies them there, straight
// from gRPC's buffers when they are still there. len(dst) must be
// in.nbytes/4.
func (in *inFrame) combineInto(dst []float32, add bool) {
	if in.raw == nil {
		if add {
			fsum.Add(dst, in.data)
		} else {
			copy(dst, in.data)
		}
		return
	}
	c := in.rawAt
	var carry [4]byte // a value split between two pieces
	nc := 0
	for k := 0; k < len(dst); {
		b := c.s[c.i].ReadOnlyData()[c.off:]
		c.i, c.off = c.i+1, 0
		if nc > 0 {
			t := copy(carry[nc:], b)
			nc, b = nc+t, b[t:]
			if nc < 4 {
				continue
			}
			v := math.Float32frombits(binary.LittleEndian.Uint32(carry[:]))
			if add {
				dst[k] += v
			} else {
				dst[k] = v
			}
			k, nc = k+1, 0
		}
		m := min(len(b)/4, len(dst)-k)
		combineLE(dst[k:k+m], b[:4*m], add)
		k += m
		if k < len(dst) {
			nc = copy(carry[:], b[4*m:])
		}
	}
	in.release()
}

// dataBuf returns in.store resized to n elements.
func (in *inFrame) dataBuf(n int) []float32 {
	if cap(in.store) < n {
		in.store = make([]float32, n)
	}
	return in.store[:n]
}

// fromProto fills in from a message decoded by the ordinary proto codec
// (a client that does not use our content subtype).
func (in *inFrame) fromProto(req *pb.SendFramesRequest) {
	in.reset()
	f := req.GetFrame()
	in.job = append(in.job, f.GetJobId()...)
	in.gen, in.op, in.step, in.phase, in.chunk = f.GetGeneration(), f.GetOp(), f.GetStep(), f.GetPhase(), f.GetChunk()
	in.offset, in.dtype, in.rank = f.GetOffset(), f.GetDtype(), f.GetRank()
	in.nbytes = len(f.GetData())
	if in.nbytes%4 == 0 {
		in.data = in.dataBuf(in.nbytes / 4)
		_ = wire.GetF32(in.data, f.GetData()) // lengths match
	}
}

var errMalformed = errors.New("ringrpc: malformed SendFramesRequest")

// decode parses a SendFramesRequest from gRPC's receive buffers.
func (in *inFrame) decode(s mem.BufferSlice) error {
	in.reset()
	c := cursor{s: s, n: s.Len()}
	for c.n > 0 && c.err == nil {
		num, typ := c.tag()
		if num == 1 && typ == protowire.BytesType {
			l := c.varint()
			if l > uint64(c.n) {
				return errMalformed
			}
			in.decodeFrame(&c, c.n-int(l))
			continue
		}
		c.skip(typ)
	}
	if c.err != nil {
		return fmt.Errorf("%w: %v", errMalformed, c.err)
	}
	return nil
}

// decodeFrame parses TensorFrame fields until c has end bytes left.
func (in *inFrame) decodeFrame(c *cursor, end int) {
	for c.n > end && c.err == nil {
		num, typ := c.tag()
		if typ == protowire.VarintType && num != 1 && num != 10 {
			v := c.varint()
			switch num {
			case 2:
				in.gen = v
			case 3:
				in.op = pb.Op(int32(v))
			case 4:
				in.step = int64(v)
			case 5:
				in.phase = uint32(v)
			case 6:
				in.chunk = uint32(v)
			case 7:
				in.offset = v
			case 9:
				in.dtype = pb.DType(int32(v))
			case 12:
				in.rank = int32(v)
			}
			continue
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			l := c.varint()
			if l > uint64(c.n-end) || l > 1<<10 {
				c.fail(errMalformed)
				return
			}
			in.job = in.job[:0]
			for range l {
				in.job = append(in.job, c.byte())
			}
		case num == 10 && typ == protowire.BytesType:
			l := c.varint()
			if l > uint64(c.n-end) || l > wire.MaxFrameBytes {
				c.fail(fmt.Errorf("data field of %d bytes; at most %d allowed", l, wire.MaxFrameBytes))
				return
			}
			in.nbytes, in.hasData = int(l), true
			in.raw, in.rawAt, in.data = nil, *c, nil
			c.discard(int(l))
			if c.err == nil && l > 0 && l%4 == 0 {
				in.raw = c.s
			}
		default:
			c.skip(typ)
		}
	}
	if c.n < end {
		c.fail(errMalformed)
	}
}

// cursor reads protobuf wire data across the pieces of a BufferSlice
// without copying them into one buffer.
type cursor struct {
	s   mem.BufferSlice
	i   int // current piece
	off int // offset in the current piece
	n   int // bytes left in total
	err error
}

func (c *cursor) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.n = 0
}

func (c *cursor) byte() byte {
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

func (c *cursor) read(dst []byte) {
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

func (c *cursor) discard(k int) {
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

func (c *cursor) varint() uint64 {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b := c.byte()
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	c.fail(errMalformed)
	return 0
}

func (c *cursor) tag() (protowire.Number, protowire.Type) {
	num, typ := protowire.DecodeTag(c.varint())
	if num <= 0 {
		c.fail(errMalformed)
	}
	return num, typ
}

func (c *cursor) skip(typ protowire.Type) {
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
			c.fail(errMalformed)
			return
		}
		c.discard(int(l))
	default:
		c.fail(fmt.Errorf("unsupported wire type %d", typ))
	}
}

func opToPB(o aggregator.OpKind) pb.Op {
	switch o {
	case aggregator.OpAllReduce:
		return pb.Op_OP_ALL_REDUCE
	case aggregator.OpAllGather:
		return pb.Op_OP_ALL_GATHER
	case aggregator.OpBroadcast:
		return pb.Op_OP_BROADCAST
	case aggregator.OpBarrier:
		return pb.Op_OP_BARRIER
	}
	return pb.Op_OP_UNSPECIFIED
}

func opFromPB(o pb.Op) aggregator.OpKind {
	switch o {
	case pb.Op_OP_ALL_REDUCE:
		return aggregator.OpAllReduce
	case pb.Op_OP_ALL_GATHER:
		return aggregator.OpAllGather
	case pb.Op_OP_BROADCAST:
		return aggregator.OpBroadcast
	case pb.Op_OP_BARRIER:
		return aggregator.OpBarrier
	}
	return aggregator.OpInvalid
}
