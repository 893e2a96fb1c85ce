package psstep

import (
	"fmt"

	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The ps wire encoding of compress's pushes: a compress.PSFrame becomes
// a pb.TensorFrame with the job's tags, its encoding a dtype.

// dtypes are the wire dtypes of compress's encodings.
var dtypes = map[compress.PSEncoding]pb.DType{
	compress.PSF32:    pb.DType_D_TYPE_F32,
	compress.PSF16:    pb.DType_D_TYPE_F16,
	compress.PSBF16:   pb.DType_D_TYPE_BF16,
	compress.PSInt8:   pb.DType_D_TYPE_I8,
	compress.PSSparse: pb.DType_D_TYPE_SPARSE_F32,
}

// DType is the wire dtype of frames encoded as e.
func DType(e compress.PSEncoding) pb.DType {
	d, ok := dtypes[e]
	if !ok {
		panic(fmt.Sprintf("psstep: no dtype for %v", e))
	}
	return d
}

// Frame is f as a TensorFrame tagged like tag (job, generation, op,
// step, rank); its data and scales alias f's.
func Frame(tag *pb.TensorFrame, f *compress.PSFrame) *pb.TensorFrame {
	return &pb.TensorFrame{JobId: tag.JobId, Generation: tag.Generation, Op: tag.Op, Step: tag.Step, Phase: f.Phase,
		Rank: tag.Rank, Chunk: f.Chunk, Offset: uint64(f.Offset), Total: uint64(f.Total), Dtype: DType(f.Encoding), Last: f.Last,
		Data: f.Data, Scales: f.Scales, ScaleChunk: f.ScaleChunk, Span: uint64(f.Span)}
}

// FrameSender is a compress.PSSender that hands send whole TensorFrames
// tagged like tag: SendF32 writes the values into the frame's data (a
// buffer it reuses), as wire.Splitter.Frames does. send must not keep
// the frame after it returns.
func FrameSender(tag *pb.TensorFrame, send func(*pb.TensorFrame) error) compress.PSSender {
	return &frameSender{tag: tag, send: send}
}

type frameSender struct {
	tag  *pb.TensorFrame
	send func(*pb.TensorFrame) error
	buf  []byte
}

func (s *frameSender) SendFrame(f *compress.PSFrame) error { return s.send(Frame(s.tag, f)) }

func (s *frameSender) SendF32(f *compress.PSFrame, vals []float32) error {
	if cap(s.buf) < 4*len(vals) {
		s.buf = make([]byte, 4*len(vals))
	}
	t := Frame(s.tag, f)
	t.Data = wire.PutF32(s.buf, vals)
	return s.send(t)
}
