package ringrpc

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// FuzzDecode checks the hand-written frame decoder against the protobuf
// library on arbitrary input split into arbitrary pieces: it never panics,
// and whatever both accept, they read the same way.
func FuzzDecode(f *testing.F) {
	good := func(fr *pb.TensorFrame) []byte {
		b, err := proto.Marshal(&pb.SendFramesRequest{Frame: fr})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(good(&pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_ALL_REDUCE, Step: 7, Phase: 1, Chunk: 2,
		Offset: 8, Dtype: pb.DType_D_TYPE_F32, Data: wire.PutF32(make([]byte, 12), []float32{1, -2, 3.5}), Rank: 1}), uint8(3))
	f.Add(good(&pb.TensorFrame{JobId: "job", Data: []byte{1, 2, 3}}), uint8(1))
	f.Add(good(&pb.TensorFrame{Step: -1, Offset: 1 << 40}), uint8(0))
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, uint8(2))
	f.Add([]byte{0x0a, 0x02, 0x52, 0x05}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		// Split b into up to three pieces, as gRPC may hand it over.
		var s mem.BufferSlice
		c1 := int(cut) % (len(b) + 1)
		c2 := c1 + (len(b)-c1)/2
		for _, p := range [][]byte{b[:c1], b[c1:c2], b[c2:]} {
			if len(p) > 0 {
				s = append(s, mem.SliceBuffer(bytes.Clone(p)))
			}
		}
		var in inFrame
		err := in.decode(s)
		var want pb.SendFramesRequest
		perr := proto.Unmarshal(b, &want)
		if err != nil || perr != nil {
			return // both refusing, or one stricter (size limits), is fine
		}
		w := want.GetFrame()
		if string(in.job) != w.GetJobId() || in.gen != w.GetGeneration() || in.op != w.GetOp() || in.step != w.GetStep() ||
			in.phase != w.GetPhase() || in.chunk != w.GetChunk() || in.offset != w.GetOffset() || in.dtype != w.GetDtype() ||
			in.rank != w.GetRank() || in.nbytes != len(w.GetData()) {
			t.Fatalf("decoder disagrees with proto:\n got job=%q gen=%d op=%v step=%d phase=%d chunk=%d off=%d dtype=%v rank=%d nbytes=%d\nwant %v",
				in.job, in.gen, in.op, in.step, in.phase, in.chunk, in.offset, in.dtype, in.rank, in.nbytes, w)
		}
		if len(w.GetData())%4 == 0 {
			vals := make([]float32, len(w.GetData())/4)
			if err := wire.GetF32(vals, w.GetData()); err != nil {
				t.Fatal(err)
			}
			for i := range vals {
				if vals[i] != in.data[i] && !(vals[i] != vals[i] && in.data[i] != in.data[i]) {
					t.Fatalf("value %d: got %v want %v", i, in.data[i], vals[i])
				}
			}
		}
	})
}
