package framecodec

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gradsync/gradsync/internal/fsum"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// maxJobBytes bounds a frame's job id (ids are at most 128 bytes).
const maxJobBytes = 1 << 10

// Frame is a received pb.TensorFrame: its tags, and its data either still
// in gRPC's receive buffers (referenced until Release, CombineInto or
// Values) or in memory of its own. A Frame is reused from message to
// message; the zero value is empty.
type Frame struct {
	JobID      []byte // reused; compare with string(f.JobID) without allocating
	Generation uint64
	Op         pb.Op
	Step       int64
	Phase      uint32
	Chunk      uint32
	Offset     uint64
	Total      uint64
	DType      pb.DType
	Scale      float32
	Rank       int32
	Last       bool
	Scales     []byte // copied (they are small); reused
	ScaleChunk uint32
	Span       uint64
	// NBytes is the length of the data field in bytes; HasData says the
	// field was present.
	NBytes  int
	HasData bool

	// The data is either still in raw (from piece rawAt.i at byte
	// rawAt.off on; raw holds a reference that Release drops), or decoded
	// into data (store[:NBytes/4]) by Values.
	raw   mem.BufferSlice
	rawAt Cursor
	data  []float32
	store []float32 // backing array of data, grown as needed

	tf *pb.TensorFrame // Check's view of the tags; reused
}

// Reset empties f, keeping its buffers. It does not release f's data:
// call Release first.
func (f *Frame) Reset() {
	*f = Frame{JobID: f.JobID[:0], Scales: f.Scales[:0], store: f.store, tf: f.tf}
}

// Release drops f's reference to gRPC's receive buffers, if it holds one.
func (f *Frame) Release() {
	if f.raw != nil {
		f.raw.Free()
		f.raw = nil
	}
}

// ref takes the reference to gRPC's buffers that Release drops.
func (f *Frame) ref() {
	if f.raw != nil {
		f.raw.Ref()
	}
}

// SetProto fills f from a frame decoded by the ordinary proto codec (a
// client that does not speak this package's content subtype). f's data
// is a view of t.Data, which must not change while f uses it.
func (f *Frame) SetProto(t *pb.TensorFrame) {
	f.Release()
	f.Reset()
	if t == nil {
		return
	}
	f.JobID = append(f.JobID, t.GetJobId()...)
	f.Generation, f.Op, f.Step, f.Phase, f.Chunk = t.GetGeneration(), t.GetOp(), t.GetStep(), t.GetPhase(), t.GetChunk()
	f.Offset, f.Total, f.DType, f.Scale, f.Rank, f.Last = t.GetOffset(), t.GetTotal(), t.GetDtype(), t.GetScale(), t.GetRank(), t.GetLast()
	f.Scales = append(f.Scales, t.GetScales()...)
	f.ScaleChunk, f.Span = t.GetScaleChunk(), t.GetSpan()
	f.NBytes, f.HasData = len(t.GetData()), len(t.GetData()) > 0
	if f.NBytes > 0 {
		f.raw = mem.BufferSlice{mem.SliceBuffer(t.GetData())}
		f.rawAt = NewCursor(f.raw)
	}
}

// Check validates f's tags and sizes as wire.Check does a pb.TensorFrame.
func (f *Frame) Check(want wire.Expect) (off, n int, err error) {
	return wire.CheckSized(f.tags(), f.NBytes, len(f.Scales), want)
}

// Take has a take f as the next frame of its tensor (wire.Assembler.Take)
// and returns the element range f covers; its data stays where it is.
func (f *Frame) Take(a *wire.Assembler) (off, n int, err error) {
	return a.Take(f.tags(), f.NBytes, len(f.Scales))
}

// Assemble has a take f (see Take) and copies its float32 values into
// dst, the whole tensor, straight from gRPC's buffers (CombineInto).
func (f *Frame) Assemble(a *wire.Assembler, dst []float32) error {
	off, n, err := f.Take(a)
	if err != nil {
		return err
	}
	if f.NBytes != 4*n || off+n > len(dst) {
		return &wire.Mismatch{Msg: fmt.Sprintf("%d data bytes for %d float32 values at %d of a tensor of %d", f.NBytes, n, off, len(dst))}
	}
	f.CombineInto(dst[off:off+n], false)
	return nil
}

// tags is f's tags as a pb.TensorFrame without data, for the checks of
// package wire; the frame is f's own, reused.
func (f *Frame) tags() *pb.TensorFrame {
	if f.tf == nil {
		f.tf = &pb.TensorFrame{}
	}
	t := f.tf
	if string(f.JobID) != t.JobId {
		t.JobId = string(f.JobID)
	}
	t.Generation, t.Op, t.Step, t.Phase, t.Chunk = f.Generation, f.Op, f.Step, f.Phase, f.Chunk
	t.Offset, t.Total, t.Dtype, t.Scale, t.Rank, t.Last = f.Offset, f.Total, f.DType, f.Scale, f.Rank, f.Last
	t.ScaleChunk, t.Span = f.ScaleChunk, f.Span
	return t
}

// Values returns f's data decoded as float32 values (NBytes/4 of them;
// nil when NBytes is not a multiple of 4), in a buffer f reuses. It
// releases gRPC's buffers.
func (f *Frame) Values() []float32 {
	if f.raw != nil && f.NBytes%4 == 0 {
		f.data = f.dataBuf(f.NBytes / 4)
		c := f.rawAt
		readF32(&c, f.data)
		f.Release()
	}
	return f.data
}

// AppendData appends f's data bytes to b.
func (f *Frame) AppendData(b []byte) []byte {
	if f.raw != nil {
		c := f.rawAt
		return c.appendN(b, f.NBytes)
	}
	n := len(b)
	b = slices.Grow(b, 4*len(f.data))[:n+4*len(f.data)]
	wire.PutF32(b[n:], f.data)
	return b
}

// CombineInto adds f's float32 values to dst (add) or copies them there,
// straight from gRPC's buffers when they are still there, and releases
// those. len(dst) must be NBytes/4 and NBytes a multiple of 4.
func (f *Frame) CombineInto(dst []float32, add bool) {
	if f.NBytes%4 != 0 || len(dst) != f.NBytes/4 {
		panic("framecodec: CombineInto: the destination does not match the frame's data")
	}
	if f.raw == nil {
		if add {
			fsum.Add(dst, f.data)
		} else {
			copy(dst, f.data)
		}
		return
	}
	c := f.rawAt
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
	f.Release()
}

// dataBuf returns f.store resized to n elements.
func (f *Frame) dataBuf(n int) []float32 {
	if cap(f.store) < n {
		f.store = make([]float32, n)
	}
	return f.store[:n]
}

// decode parses TensorFrame fields into f (merging, as protobuf does
// with a message field that occurs more than once) until c has end
// bytes left.
func (f *Frame) decode(c *Cursor, end int) {
	for c.n > end && c.err == nil {
		num, typ := c.tag()
		switch {
		case typ == protowire.VarintType:
			v := c.varint()
			switch num {
			case 2:
				f.Generation = v
			case 3:
				f.Op = pb.Op(int32(v))
			case 4:
				f.Step = int64(v)
			case 5:
				f.Phase = uint32(v)
			case 6:
				f.Chunk = uint32(v)
			case 7:
				f.Offset = v
			case 8:
				f.Total = v
			case 9:
				f.DType = pb.DType(int32(v))
			case 12:
				f.Rank = int32(v)
			case 13:
				f.Last = v != 0
			case 15:
				f.ScaleChunk = uint32(v)
			case 16:
				f.Span = v
			}
		case num == 11 && typ == protowire.Fixed32Type:
			f.Scale = math.Float32frombits(c.fixed32())
		case num == 1 && typ == protowire.BytesType:
			l, ok := c.length(end, maxJobBytes)
			if !ok {
				return
			}
			f.JobID = c.appendN(f.JobID[:0], l)
		case num == 14 && typ == protowire.BytesType:
			l, ok := c.length(end, wire.MaxFrameBytes)
			if !ok {
				return
			}
			f.Scales = c.appendN(f.Scales[:0], l)
		case num == 10 && typ == protowire.BytesType:
			l, ok := c.length(end, wire.MaxFrameBytes)
			if !ok {
				return
			}
			f.NBytes, f.HasData = l, true
			f.raw, f.rawAt, f.data = nil, *c, nil
			c.discard(l)
			if c.err == nil && l > 0 {
				f.raw = c.s
			}
		default:
			c.skip(typ)
		}
	}
	if c.n < end {
		c.fail(ErrMalformed)
	}
}

// UnmarshalField parses a message whose field num is a TensorFrame into
// f (the message's other fields are skipped), from gRPC's receive
// buffers: pb.SendFramesRequest is such a message with num 1. On success
// f holds a reference to s while its data is there (see Release).
func (f *Frame) UnmarshalField(s mem.BufferSlice, num protowire.Number) error {
	f.Reset()
	c := NewCursor(s)
	for c.n > 0 && c.err == nil {
		n, typ := c.tag()
		if n == num && typ == protowire.BytesType {
			l, ok := c.length(0, uint64(c.n))
			if ok {
				f.decode(&c, c.n-l)
			}
			continue
		}
		c.skip(typ)
	}
	if c.err != nil {
		f.raw = nil // no reference taken
		return fmt.Errorf("%w: %v", ErrMalformed, c.err)
	}
	f.ref()
	return nil
}
