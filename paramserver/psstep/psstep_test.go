package psstep_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// segs is a 32×24 matrix PowerSGD compresses (rank 2 is 6.9× smaller)
// and a bias it sends uncompressed.
var segs = []models.Segment{
	{Name: "fc.weight", Shape: []int{32, 24}, Offset: 0, Len: 768},
	{Name: "fc.bias", Shape: []int{32}, Offset: 768, Len: 32},
}

const total = 800

func script(exs []psstep.Exchange) string {
	var b strings.Builder
	for _, e := range exs {
		fmt.Fprintf(&b, "%v/%d@%d ", e.Kind, e.Phase, e.Step)
	}
	return strings.TrimSpace(b.String())
}

// TestPlanScripts: the exchanges of a step, as a script, for one push
// and for PowerSGD's two, and the state exchanges a checkpoint adds.
func TestPlanScripts(t *testing.T) {
	cases := []struct {
		name string
		spec *pb.CompressionSpec
		step int64
		want string
	}{
		{"none", nil, 4, "push/0@4 params/0@5"},
		{"fp16", &pb.CompressionSpec{Type: "fp16"}, 4, "push/0@4 params/0@5"},
		{"powersgd before its start", &pb.CompressionSpec{Type: "powersgd", StartIter: 3}, 2, "push/0@2 params/0@3"},
		{"powersgd", &pb.CompressionSpec{Type: "powersgd", StartIter: 3}, 3, "push/1@3 factors/1@3 push/2@3 params/0@4 shared-q/2@4"},
	}
	for _, c := range cases {
		recv, err := compress.NewPSReceiver(scheme(t, c.spec, 0), segs, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := script(psstep.Plan(c.step, recv.Phases(c.step))); got != c.want {
			t.Errorf("%s: plan %q, want %q", c.name, got, c.want)
		}
	}
	if got, want := script(psstep.AskState(9)), "state/0@10 written/0@10"; got != want {
		t.Errorf("state: %q, want %q", got, want)
	}
	if got := fmt.Sprint(psstep.Kind(0), psstep.Kind(9), psstep.Decision(7)); got != "Kind(0) Kind(9) Decision(7)" {
		t.Errorf("names of values out of range: %q", got)
	}
	for _, k := range []psstep.Kind{psstep.Push, psstep.State} {
		if !k.FromRank() {
			t.Errorf("%v: want from the rank", k)
		}
	}
	for _, k := range []psstep.Kind{psstep.Factors, psstep.Params, psstep.SharedQ, psstep.Written} {
		if k.FromRank() {
			t.Errorf("%v: want from the shard", k)
		}
	}
}

// rank is one rank's side of the in-memory drive.
type rank struct {
	side   *psstep.Rank
	grads  []float32
	frames []*pb.TensorFrame // pushed, not yet taken by the shard
	avg    []float32         // the shard's averaged gradient (Params)
	log    []psstep.Exchange
}

// TestBothSidesInMemory drives n ranks' psstep.Rank and the shard's
// psstep.Shard through the plan, each side from its own half's Phases,
// with frames passed in memory (checked by wire.Assembler as on the
// wire), and checks that both sides walk the same exchanges and that
// the shard's averaged gradient is the ranks' mean as the scheme
// transmits it.
func TestBothSidesInMemory(t *testing.T) {
	const n = 2
	a := make([]float32, 32)
	b := make([]float32, 24)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	for j := range b {
		b[j] = float32(j%5)*0.25 - 0.5
	}
	grad := func(r int) []float32 {
		g := make([]float32, total)
		for i := range 32 {
			for j := range 24 {
				g[i*24+j] = float32(r+1) * a[i] * b[j] // rank 1: PowerSGD recovers it
			}
		}
		for i := 768; i < total; i++ {
			g[i] = float32(r+1) * float32(i-768) / 8
		}
		return g
	}
	half := func(v float32) float32 { return compress.F16ToF32(compress.F32ToF16(v)) }
	cases := []struct {
		name string
		spec *pb.CompressionSpec
		// exact: the mean of what each rank transmits; tol for PowerSGD.
		transmit func(float32) float32
		tol      float64
	}{
		{"none", nil, func(v float32) float32 { return v }, 0},
		{"fp16", &pb.CompressionSpec{Type: "fp16"}, half, 0},
		{"powersgd", &pb.CompressionSpec{Type: "powersgd", Rank: 2, StartIter: -1}, func(v float32) float32 { return v }, 1e-4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			recv, err := compress.NewPSReceiver(scheme(t, c.spec, 0), segs, n)
			if err != nil {
				t.Fatal(err)
			}
			ranks := make([]*rank, n)
			for r := range ranks {
				p, err := compress.NewPSPusher(scheme(t, c.spec, 7), segs, r)
				if err != nil {
					t.Fatal(err)
				}
				ranks[r] = &rank{side: psstep.NewRank(p), grads: grad(r)}
			}
			rec := &record{}
			shard := psstep.NewShard(aggregator.NewSyncShard(make([]float32, total), n, rec, false), recv)
			for step := range int64(3) {
				driveStep(t, step, recv, shard, rec, ranks)
				for r, rk := range ranks[1:] {
					if script(rk.log) != script(ranks[0].log) {
						t.Fatalf("rank %d walked %q, rank 0 %q", r+1, script(rk.log), script(ranks[0].log))
					}
				}
				want := make([]float32, total)
				for _, rk := range ranks {
					for i, v := range rk.grads {
						want[i] += c.transmit(v)
					}
				}
				for i, rk := range ranks {
					for j := range want {
						w := want[j] / n
						if d := math.Abs(float64(rk.avg[j] - w)); d > c.tol*(1+math.Abs(float64(w))) {
							t.Fatalf("step %d rank %d: avg[%d] = %v, want %v", step, i, j, rk.avg[j], w)
						}
					}
				}
			}
		})
	}
}

// driveStep runs step: the shard walks its plan (from phases, its
// receiver's), and each exchange from a rank is first produced by every
// rank walking its own; the frames pass in memory, checked by
// wire.Assembler as on the wire. recv is the shard's receiver, rec its
// optimiser.
func driveStep(t *testing.T, step int64, recv *compress.PSReceiver, shard *psstep.Shard, rec *record, ranks []*rank) {
	t.Helper()
	plans := make([][]psstep.Exchange, len(ranks))
	for r, rk := range ranks {
		plans[r], rk.log = rk.side.Plan(step), nil
	}
	for i, ex := range psstep.Plan(step, recv.Phases(step)) {
		for r, rk := range ranks {
			if plans[r][i] != ex {
				t.Fatalf("step %d exchange %d: rank %d plans %v, the shard %v", step, i, r, plans[r][i], ex)
			}
			rk.log = append(rk.log, ex)
		}
		if ex.Kind != psstep.Push {
			v := shard.Answer(ex)
			if ex.Kind == psstep.Params {
				v = rec.grads[len(rec.grads)-1] // the averaged gradient applied
			}
			for _, rk := range ranks {
				if ex.Kind == psstep.Params {
					rk.avg = slices.Clone(v)
				} else {
					copy(rk.side.Factors(ex), v)
				}
			}
			continue
		}
		for r, rk := range ranks {
			tag := &pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Rank: int32(r)}
			send := psstep.FrameSender(tag, func(f *pb.TensorFrame) error {
				c := proto.Clone(f).(*pb.TensorFrame) // the pusher reuses f's buffers
				rk.frames = append(rk.frames, c)
				return nil
			})
			if err := rk.side.Push(ex, rk.grads, send); err != nil {
				t.Fatal(err)
			}
		}
		// The shard takes the ranks' frames as they would arrive: rank by rank.
		for r, rk := range ranks {
			var asm wire.Assembler
			asm.Start(wire.Expect{JobID: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: ex.Step, Total: uint64(ex.Push.Total), DType: psstep.DType(ex.Push.Encoding)}, ex.Phase)
			for _, f := range rk.frames {
				off, k, err := asm.Take(f, len(f.Data), len(f.Scales))
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				decode := func(dst []float32) error {
					return recv.DecodeAdd(dst, f.Data, f.Scales, int(f.ScaleChunk), ex.Push)
				}
				if _, err := shard.Add(r, step, ex.Push, off, k, decode); err != nil {
					t.Fatal(err)
				}
			}
			if !asm.Done() {
				t.Fatalf("rank %d: the push of phase %d ended at %d of %d", r, ex.Phase, asm.Received(), ex.Push.Total)
			}
			rk.frames = nil
		}
	}
	for r, rk := range ranks {
		if err := rk.side.Applied(step); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestFrames: compress's frames are the wire's size, and every encoding
// has its dtype.
func TestFrames(t *testing.T) {
	if compress.PSFrameElems != wire.DefaultFrameElems {
		t.Errorf("compress.PSFrameElems %d, wire.DefaultFrameElems %d: pushes and parameters would be cut differently", compress.PSFrameElems, wire.DefaultFrameElems)
	}
	want := map[compress.PSEncoding]pb.DType{compress.PSF32: pb.DType_D_TYPE_F32, compress.PSF16: pb.DType_D_TYPE_F16,
		compress.PSBF16: pb.DType_D_TYPE_BF16, compress.PSInt8: pb.DType_D_TYPE_I8, compress.PSSparse: pb.DType_D_TYPE_SPARSE_F32}
	for e, d := range want {
		if got := psstep.DType(e); got != d {
			t.Errorf("%v: dtype %v, want %v", e, got, d)
		}
	}
	tag := &pb.TensorFrame{JobId: "j", Generation: 2, Op: pb.Op_OP_PUSH_GRADIENT, Step: 5, Rank: 1}
	f := psstep.Frame(tag, &compress.PSFrame{Phase: 1, Encoding: compress.PSSparse, Chunk: 3, Offset: 9, Total: 20, Last: true,
		Data: []byte{1}, Scales: []byte{2}, ScaleChunk: 4, Span: 6})
	w := &pb.TensorFrame{JobId: "j", Generation: 2, Op: pb.Op_OP_PUSH_GRADIENT, Step: 5, Rank: 1, Phase: 1, Dtype: pb.DType_D_TYPE_SPARSE_F32,
		Chunk: 3, Offset: 9, Total: 20, Last: true, Data: []byte{1}, Scales: []byte{2}, ScaleChunk: 4, Span: 6}
	if !proto.Equal(f, w) {
		t.Errorf("frame %v, want %v", f, w)
	}
}

// scheme maps a valid CompressionSpec through jobspec, as the server does.
func scheme(t testing.TB, spec *pb.CompressionSpec, seed int64) compress.Scheme {
	t.Helper()
	sc, err := jobspec.CompressionScheme(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}
