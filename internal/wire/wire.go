// Package wire encodes flat float32 tensors into bounded TensorFrames and
// checks frames that arrive: right job, generation, op, step, offset and
// length, and a byte count that matches the dtype. Bulk data travels as raw
// little-endian bytes, never as repeated floats.
package wire

import (
	"encoding/binary"
	"fmt"
	"math"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// MaxFrameBytes bounds the data of one frame (DESIGN.md: frames ≤ 4 MiB).
const MaxFrameBytes = 4 << 20

// DefaultFrameElems is the number of float32 values per frame we send: 1 MiB.
const DefaultFrameElems = 1 << 18

// MaxMessageBytes is the gRPC message limit for streams that carry frames:
// one full frame plus room for its tags.
const MaxMessageBytes = MaxFrameBytes + 64<<10

// PutF32 writes src as little-endian float32 into dst, which must hold
// 4*len(src) bytes, and returns dst[:4*len(src)].
func PutF32(dst []byte, src []float32) []byte {
	dst = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return dst
}

// GetF32 decodes little-endian float32 bytes into dst. len(src) must be
// exactly 4*len(dst).
func GetF32(dst []float32, src []byte) error {
	if len(src) != 4*len(dst) {
		return fmt.Errorf("wire: %d data bytes for %d float32 values (want %d)", len(src), len(dst), 4*len(dst))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return nil
}

// AddF32 adds little-endian float32 bytes into dst (dst[i] += src[i]).
func AddF32(dst []float32, src []byte) error {
	if len(src) != 4*len(dst) {
		return fmt.Errorf("wire: %d data bytes for %d float32 values (want %d)", len(src), len(dst), 4*len(dst))
	}
	for i := range dst {
		dst[i] += math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return nil
}

// Expect is what a receiver knows a frame must be.
type Expect struct {
	JobID      string
	Generation uint64
	Op         pb.Op
	Step       int64
	// Total is the length of the whole tensor in elements.
	Total uint64
	// DType is the encoding the frame must have; the zero value means
	// D_TYPE_F32. (The phase is the caller's to check.)
	DType pb.DType
}

// elemBytes is the size of one element of a dense dtype (0: not dense).
func elemBytes(d pb.DType) int {
	switch d {
	case pb.DType_D_TYPE_F32:
		return 4
	case pb.DType_D_TYPE_F16, pb.DType_D_TYPE_BF16:
		return 2
	case pb.DType_D_TYPE_I8:
		return 1
	}
	return 0
}

// Mismatch is a frame that is not the one expected. Stale says the frame is
// from an older generation or step (the caller answers Aborted); otherwise it
// is malformed (InvalidArgument).
type Mismatch struct {
	Stale bool
	Msg   string
}

func (e *Mismatch) Error() string { return "wire: " + e.Msg }

// Check validates a frame's tags and size against what is expected and
// returns the element range [off, off+n) it covers: len(data) over the
// element size for dense dtypes, span for D_TYPE_SPARSE_F32 (whose pairs
// the decoder checks).
func Check(f *pb.TensorFrame, want Expect) (off, n int, err error) {
	if f == nil {
		return 0, 0, &Mismatch{Msg: "missing frame"}
	}
	return CheckSized(f, len(f.Data), len(f.Scales), want)
}

// CheckSized is Check for a frame whose data (dataLen bytes) and scales
// (scalesLen bytes) are held elsewhere (still in gRPC's receive
// buffers): f's own Data and Scales are not looked at.
func CheckSized(f *pb.TensorFrame, dataLen, scalesLen int, want Expect) (off, n int, err error) {
	if f.JobId != want.JobID {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame for job %q, want %q", f.JobId, want.JobID)}
	}
	if f.Generation != want.Generation {
		return 0, 0, &Mismatch{Stale: f.Generation < want.Generation, Msg: fmt.Sprintf("frame from generation %d, want %d", f.Generation, want.Generation)}
	}
	if f.Op != want.Op {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame for op %v, want %v", f.Op, want.Op)}
	}
	if f.Step != want.Step {
		return 0, 0, &Mismatch{Stale: f.Step < want.Step, Msg: fmt.Sprintf("frame for step %d, want %d", f.Step, want.Step)}
	}
	dt := want.DType
	if dt == pb.DType_D_TYPE_UNSPECIFIED {
		dt = pb.DType_D_TYPE_F32
	}
	if f.Dtype != dt {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("dtype %v not accepted here; want %v", f.Dtype, dt)}
	}
	if f.Total != want.Total {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame says the tensor has %d elements, want %d", f.Total, want.Total)}
	}
	if dataLen > MaxFrameBytes || scalesLen > MaxFrameBytes {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame carries %d data and %d scale bytes; at most %d each allowed", dataLen, scalesLen, MaxFrameBytes)}
	}
	var elems uint64
	if eb := elemBytes(dt); eb > 0 {
		if dataLen%eb != 0 {
			return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame carries %d bytes, not a multiple of %d (%v)", dataLen, eb, dt)}
		}
		elems = uint64(dataLen / eb)
	} else {
		elems = f.Span // sparse: the data's pairs are checked as they are decoded
	}
	if f.Offset > want.Total || elems > want.Total-f.Offset {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame covers [%d, %d), outside the tensor of %d elements", f.Offset, f.Offset+elems, want.Total)}
	}
	return int(f.Offset), int(elems), nil
}

// Splitter cuts a flat tensor into frames of at most FrameElems values.
type Splitter struct {
	FrameElems int // 0: DefaultFrameElems
	buf        []byte
}

// Frames calls send for each frame of src, in order, reusing one byte buffer
// (send must not keep the frame after it returns). The last frame has Last
// set; an empty tensor is sent as one empty last frame.
func (s *Splitter) Frames(tag *pb.TensorFrame, src []float32, send func(*pb.TensorFrame) error) error {
	fe := s.frameElems()
	if cap(s.buf) < 4*min(fe, len(src)) {
		s.buf = make([]byte, 4*min(fe, len(src)))
	}
	return s.Pieces(tag, src, func(f *pb.TensorFrame, vals []float32) error {
		f.Data = PutF32(s.buf, vals)
		return send(f)
	})
}

// Pieces cuts src as Frames does, but hands send each frame without its
// data (Dtype D_TYPE_F32, every other tag set) and the values it covers,
// a sub-slice of src, for senders that encode them without copying.
func (s *Splitter) Pieces(tag *pb.TensorFrame, src []float32, send func(f *pb.TensorFrame, vals []float32) error) error {
	fe := s.frameElems()
	chunk := uint32(0)
	for off := 0; ; off += fe {
		end := min(off+fe, len(src))
		f := &pb.TensorFrame{
			JobId: tag.JobId, Generation: tag.Generation, Op: tag.Op, Step: tag.Step, Phase: tag.Phase,
			Rank: tag.Rank, Chunk: chunk, Offset: uint64(off), Total: uint64(len(src)),
			Dtype: pb.DType_D_TYPE_F32, Last: end >= len(src),
		}
		if err := send(f, src[off:end]); err != nil {
			return err
		}
		if f.Last {
			return nil
		}
		chunk++
	}
}

func (s *Splitter) frameElems() int {
	if fe := s.FrameElems; fe > 0 && fe*4 <= MaxFrameBytes {
		return fe
	}
	return DefaultFrameElems
}

// AllFinite reports whether every value is neither NaN nor ±Inf.
func AllFinite(v []float32) bool {
	for _, x := range v {
		if x-x != 0 { // NaN and ±Inf give NaN
			return false
		}
	}
	return true
}
