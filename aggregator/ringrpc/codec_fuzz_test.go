package ringrpc

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"

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
	// As the ring encodes it: the data length padded for alignment.
	o := newOutFrame()
	o.encode("job", 1, aggregator.Frame{Generation: 2, Op: aggregator.OpAllReduce, Step: 9, Data: []float32{1, 2, 3}})
	f.Add(append(bytes.Clone(o.Header()), o.Data()...), uint8(9))
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
		if string(in.JobID) != w.GetJobId() || in.Generation != w.GetGeneration() || in.Op != w.GetOp() || in.Step != w.GetStep() ||
			in.Phase != w.GetPhase() || in.Chunk != w.GetChunk() || in.Offset != w.GetOffset() || in.DType != w.GetDtype() ||
			in.Rank != w.GetRank() || in.NBytes != len(w.GetData()) {
			t.Fatalf("decoder disagrees with proto:\n got job=%q gen=%d op=%v step=%d phase=%d chunk=%d off=%d dtype=%v rank=%d nbytes=%d\nwant %v",
				in.JobID, in.Generation, in.Op, in.Step, in.Phase, in.Chunk, in.Offset, in.DType, in.Rank, in.NBytes, w)
		}
		if len(w.GetData())%4 == 0 {
			vals := make([]float32, len(w.GetData())/4)
			if err := wire.GetF32(vals, w.GetData()); err != nil {
				t.Fatal(err)
			}
			// The values three ways: copied and added straight from the
			// pieces (RecvLeftInto), and decoded (RecvLeft).
			got := make([]float32, len(vals))
			in2 := in
			in2.combineInto(got, false)
			sum := make([]float32, len(vals))
			for i := range sum {
				sum[i] = float32(i) - 0.5
			}
			in3 := in
			in3.combineInto(sum, true)
			data := in.frame().Data
			if len(data) != len(vals) {
				t.Fatalf("frame has %d values, want %d", len(data), len(vals))
			}
			same := func(a, b float32) bool { return a == b || a != a && b != b }
			for i := range vals {
				if !same(got[i], vals[i]) || !same(data[i], vals[i]) || !same(sum[i], (float32(i)-0.5)+vals[i]) {
					t.Fatalf("value %d: got %v (copied), %v (decoded), sum %v; want %v", i, got[i], data[i], sum[i], vals[i])
				}
			}
		}
	})
}

// TestEncodeAligned checks that encoded frames are what the protobuf
// library reads (the padded length included) and that their values start
// 4-byte aligned after gRPC's message prefix.
func TestEncodeAligned(t *testing.T) {
	for _, n := range []int{0, 1, 3, 31, 32, 33, 4099, 1 << 18} {
		for _, job := range []string{"j", "job-12", "a-much-longer-job-name"} {
			data := make([]float32, n)
			for i := range data {
				data[i] = float32(i) - 0.25
			}
			f := aggregator.Frame{Generation: 3, Op: aggregator.OpAllReduce, Step: 1 << 40, Phase: 1, Chunk: 2, Offset: 77, Data: data}
			o := newOutFrame()
			o.encode(job, 5, f)
			if n > 0 && (grpcPrefix+len(o.Header()))%4 != 0 {
				t.Errorf("n=%d job %q: values start at %d after the gRPC prefix, not 4-aligned", n, job, len(o.Header()))
			}
			b := append(bytes.Clone(o.Header()), o.Data()...)
			var req pb.SendFramesRequest
			if err := proto.Unmarshal(b, &req); err != nil {
				t.Fatalf("n=%d job %q: proto: %v", n, job, err)
			}
			w := req.GetFrame()
			if w.GetJobId() != job || w.GetGeneration() != 3 || w.GetOp() != pb.Op_OP_ALL_REDUCE || w.GetStep() != 1<<40 ||
				w.GetPhase() != 1 || w.GetChunk() != 2 || w.GetOffset() != 77 || w.GetRank() != 5 || w.GetDtype() != pb.DType_D_TYPE_F32 {
				t.Fatalf("n=%d job %q: proto read %v", n, job, w)
			}
			got := make([]float32, n)
			if err := wire.GetF32(got, w.GetData()); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != data[i] {
					t.Fatalf("n=%d: value %d: %v, want %v", n, i, got[i], data[i])
				}
			}
		}
	}
}
