package ringrpc

import (
	"sync/atomic"

	"google.golang.org/grpc/mem"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// codecName is the content subtype of streams between rings
// ("application/grpc+gradsyncframes"): internal/wire/framecodec's codec.
// The bytes on the wire are exactly pb.SendFramesRequest's protobuf
// encoding; only the Go side differs.
const codecName = framecodec.Name

// outFrame is one SendFramesRequest on its way out, encoded without
// copying its data (framecodec.Out): SendRight waits until gRPC is done
// with the caller's values (Released) before it returns.
type outFrame struct {
	*framecodec.Out
	tf pb.TensorFrame // the frame's tags; reused
	// state moves from outQueued to outSending (the sender goroutine
	// passed it to gRPC) or to outAbandoned (SendRight gave up first).
	state atomic.Int32
}

// States of an outFrame.
const (
	outQueued int32 = iota
	outSending
	outAbandoned
)

func newOutFrame() *outFrame { return &outFrame{Out: framecodec.NewOut()} }

// encode prepares f as a SendFramesRequest (its frame is field 1) from
// rank of job; f.Data must stay unchanged until gRPC is done with it.
func (o *outFrame) encode(job string, rank int, f aggregator.Frame) {
	t := &o.tf
	t.JobId, t.Generation, t.Op, t.Step, t.Phase = job, f.Generation, opToPB(f.Op), f.Step, f.Phase
	t.Chunk, t.Offset, t.Dtype, t.Rank = f.Chunk, uint64(f.Offset), pb.DType_D_TYPE_F32, int32(rank)
	o.Encode(nil, 1, t, f.Data)
}

// grpcPrefix is the length of gRPC's message prefix in front of every
// message on the wire.
const grpcPrefix = framecodec.GRPCPrefix

// inFrame is one received SendFramesRequest: its frame's tags and data
// (framecodec.Frame), decoded into buffers reused from frame to frame.
type inFrame struct {
	framecodec.Frame
}

// UnmarshalFrames implements framecodec.Unmarshaler. The values stay in
// gRPC's receive buffers until they are combined into the collective's
// buffer (or copied out for RecvLeft).
func (in *inFrame) UnmarshalFrames(data mem.BufferSlice) error { return in.decode(data) }

// release drops in's reference to gRPC's receive buffers, if it holds one.
func (in *inFrame) release() { in.Release() }

// tags is the aggregator view of in without its data.
func (in *inFrame) tags() aggregator.Frame {
	return aggregator.Frame{
		Generation: in.Generation, Op: opFromPB(in.Op), Step: in.Step, Phase: in.Phase,
		Chunk: in.Chunk, Offset: int(in.Offset),
	}
}

// frame is the aggregator view of in; Data aliases in's buffer. It
// decodes the values if they are still in gRPC's buffers.
func (in *inFrame) frame() aggregator.Frame {
	f := in.tags()
	f.Data = in.Values()
	return f
}

// combineInto adds in's values to dst (add) or copies them there, straight
// from gRPC's buffers when they are still there. len(dst) must be
// in.NBytes/4.
func (in *inFrame) combineInto(dst []float32, add bool) { in.CombineInto(dst, add) }

// fromProto fills in from a message decoded by the ordinary proto codec
// (a client that does not use our content subtype); req must not change
// while in uses its data.
func (in *inFrame) fromProto(req *pb.SendFramesRequest) { in.SetProto(req.GetFrame()) }

// decode parses a SendFramesRequest (its frame is field 1) from gRPC's
// receive buffers.
func (in *inFrame) decode(s mem.BufferSlice) error { return in.UnmarshalField(s, 1) }

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
