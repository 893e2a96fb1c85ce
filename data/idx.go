package data

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// IDX limits. MNIST-style files have 1 (labels) or 3 (images) dimensions;
// the format allows up to 255, but nothing gradsync reads needs more than 4.
const (
	maxIDXDims = 4
	// MaxIDXBytes bounds the payload of one IDX file (1 GiB), so a corrupt
	// header cannot ask for an absurd allocation.
	MaxIDXBytes = 1 << 30
)

// IDX magic numbers: two zero bytes, a type code (0x08 = unsigned byte) and
// the number of dimensions.
const (
	idxTypeUint8 = 0x08
	gzipMagic0   = 0x1f
	gzipMagic1   = 0x8b
)

// ErrFormat is wrapped by every error that reports malformed IDX input.
var ErrFormat = errors.New("malformed IDX data")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("data: %w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// ReadIDX reads one unsigned-byte IDX file from r, gzipped or raw (detected by
// the gzip magic bytes 1f 8b, not by name). It returns the dimensions and the
// payload in row-major order; len(payload) is the product of dims. The input
// must end exactly where the payload does.
//
// When r's remaining size is known (an *os.File on a regular file, or a
// reader with a Len method such as *bytes.Reader), a header claiming more
// data than the input can hold is rejected before anything is allocated and
// the payload is read into one exact allocation.
func ReadIDX(r io.Reader) (dims []int, payload []byte, err error) {
	return readIDXFrom(r, remaining(r))
}

// remaining returns how many bytes r has left, or -1 if that is unknown.
func remaining(r io.Reader) int64 {
	switch v := r.(type) {
	case interface{ Len() int }:
		return int64(v.Len())
	case *os.File:
		fi, err := v.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return -1
		}
		off, err := v.Seek(0, io.SeekCurrent)
		if err != nil || off > fi.Size() {
			return -1
		}
		return fi.Size() - off
	}
	return -1
}

// maxDeflateRatio is deflate's largest possible expansion (zlib's technical
// notes): a 258-byte match coded in 2 bits.
const maxDeflateRatio = 1032

func readIDXFrom(r io.Reader, size int64) (dims []int, payload []byte, err error) {
	br := bufio.NewReaderSize(r, 1<<16)
	head, _ := br.Peek(2)
	if len(head) < 2 {
		return nil, nil, formatErr("too short for an IDX header (%d bytes)", len(head))
	}
	var src io.Reader = br
	var gz *gzip.Reader
	limit := size // bound on the decoded IDX bytes, -1 if unknown
	if head[0] == gzipMagic0 && head[1] == gzipMagic1 {
		var err error
		gz, err = gzip.NewReader(br)
		if err != nil {
			return nil, nil, formatErr("gzip header: %v", err)
		}
		// One IDX file per gzip stream; concatenated members are not expected.
		gz.Multistream(false)
		src = gz
		if size >= 0 {
			limit = min(size, MaxIDXBytes)*maxDeflateRatio + 258
		}
	}
	dims, payload, err = readIDX(src, limit)
	if err != nil {
		return nil, nil, err
	}
	if gz != nil {
		// The gzip trailer's checksum is verified when the stream hits EOF;
		// trailing bytes after the gzip member are rejected too.
		if err := expectEOF(gz, "after the IDX payload"); err != nil {
			return nil, nil, err
		}
		if err := gz.Close(); err != nil {
			return nil, nil, formatErr("gzip: %v", err)
		}
		if err := expectEOF(br, "after the gzip stream"); err != nil {
			return nil, nil, err
		}
	} else if err := expectEOF(br, "after the IDX payload"); err != nil {
		return nil, nil, err
	}
	return dims, payload, nil
}

func expectEOF(r io.Reader, where string) error {
	var one [1]byte
	n, err := io.ReadFull(r, one[:])
	switch {
	case n > 0:
		return formatErr("unexpected trailing data %s", where)
	case err == io.EOF:
		return nil
	default:
		return formatErr("reading %s: %v", where, err)
	}
}

// readIDX parses the (decoded) IDX stream. limit, if ≥ 0, bounds the whole
// stream's length: it is known to hold no more bytes than that.
func readIDX(r io.Reader, limit int64) ([]int, []byte, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, nil, formatErr("reading magic: %v", noEOF(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, nil, formatErr("bad magic % x: want 00 00 08 <ndims>", magic)
	}
	if magic[2] != idxTypeUint8 {
		return nil, nil, formatErr("element type 0x%02x not supported: want 0x08 (unsigned byte)", magic[2])
	}
	nd := int(magic[3])
	if nd < 1 || nd > maxIDXDims {
		return nil, nil, formatErr("%d dimensions: want 1 to %d", nd, maxIDXDims)
	}
	raw := make([]byte, 4*nd)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, nil, formatErr("reading %d dimension sizes: %v", nd, noEOF(err))
	}
	dims := make([]int, nd)
	total := uint64(1)
	for i := range dims {
		d := binary.BigEndian.Uint32(raw[4*i:])
		if d == 0 || d > MaxIDXBytes {
			return nil, nil, formatErr("dimension %d has size %d: want 1 to %d", i, d, MaxIDXBytes)
		}
		dims[i] = int(d)
		total *= uint64(d) // both factors ≤ 2^30: no overflow
		if total > MaxIDXBytes {
			return nil, nil, formatErr("dimensions %v exceed %d bytes", dims[:i+1], MaxIDXBytes)
		}
	}
	if header := uint64(4 + 4*nd); limit >= 0 && total > uint64(max(limit-int64(header), 0)) {
		return nil, nil, formatErr("dimensions %v need %d bytes but the input holds at most %d", dims, total, max(limit-int64(header), 0))
	}
	payload, err := readN(r, int(total), limit >= 0)
	if err != nil {
		return nil, nil, formatErr("payload of %d bytes for dimensions %v: %v", total, dims, noEOF(err))
	}
	return dims, payload, nil
}

// readN reads exactly n bytes. Unless n is known to be backed by input
// (exact), the buffer grows as data arrives, so that a header claiming far
// more data than the input holds fails on EOF without first allocating what
// it claims.
func readN(r io.Reader, n int, exact bool) ([]byte, error) {
	first := 64 << 10
	if exact {
		first = n
	}
	buf := make([]byte, min(n, first))
	got := 0
	for {
		m, err := io.ReadFull(r, buf[got:])
		got += m
		if err != nil {
			return nil, fmt.Errorf("%w after %d bytes", err, got)
		}
		if got == n {
			return buf, nil
		}
		buf = append(buf, make([]byte, min(n, 2*len(buf))-len(buf))...)
	}
}

// noEOF turns a bare EOF into ErrUnexpectedEOF: inside a header any EOF is a
// truncation.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Images holds a decoded idx3 image file: N images of H×W pixels, row-major,
// Pix[(n*H+y)*W+x].
type Images struct {
	N, H, W int
	Pix     []uint8
}

// ReadImages reads an idx3 unsigned-byte image file (gzipped or raw).
func ReadImages(r io.Reader) (*Images, error) {
	dims, pix, err := ReadIDX(r)
	if err != nil {
		return nil, err
	}
	if len(dims) != 3 {
		return nil, formatErr("image file has %d dimensions %v: want 3 (N, H, W)", len(dims), dims)
	}
	return &Images{N: dims[0], H: dims[1], W: dims[2], Pix: pix}, nil
}

// ReadLabels reads an idx1 unsigned-byte label file (gzipped or raw).
func ReadLabels(r io.Reader) ([]uint8, error) {
	dims, labels, err := ReadIDX(r)
	if err != nil {
		return nil, err
	}
	if len(dims) != 1 {
		return nil, formatErr("label file has %d dimensions %v: want 1 (N)", len(dims), dims)
	}
	return labels, nil
}

// EncodeIDX returns the raw (uncompressed) IDX encoding of an unsigned-byte
// array with the given dimensions. It panics if len(payload) is not the
// product of dims: that is a bug in the caller.
func EncodeIDX(dims []int, payload []byte) []byte {
	if len(dims) < 1 || len(dims) > maxIDXDims {
		panic(fmt.Sprintf("data: EncodeIDX: %d dimensions, want 1 to %d", len(dims), maxIDXDims))
	}
	total := 1
	for _, d := range dims {
		if d < 1 || d > MaxIDXBytes {
			panic(fmt.Sprintf("data: EncodeIDX: bad dimension %d in %v", d, dims))
		}
		total *= d
	}
	if total != len(payload) {
		panic(fmt.Sprintf("data: EncodeIDX: dimensions %v need %d bytes, payload has %d", dims, total, len(payload)))
	}
	out := make([]byte, 4+4*len(dims), 4+4*len(dims)+len(payload))
	out[2], out[3] = idxTypeUint8, byte(len(dims))
	for i, d := range dims {
		binary.BigEndian.PutUint32(out[4+4*i:], uint32(d))
	}
	return append(out, payload...)
}
