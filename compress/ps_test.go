package compress_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// psWorld is n ranks' PSPushers and a PSReceiver, driven as the parameter
// server drives them (frames checked by wire.Check, summed in rank order).
type psWorld struct {
	push []*compress.PSPusher
	recv *compress.PSReceiver
}

func newPSWorld(t testing.TB, spec *pb.CompressionSpec, segs []models.Segment, n int, seed int64) *psWorld {
	t.Helper()
	w := &psWorld{}
	var err error
	if w.recv, err = compress.NewPSReceiver(schemeOf(t, spec, 0), segs, n); err != nil {
		t.Fatal(err)
	}
	for r := range n {
		p, err := compress.NewPSPusher(schemeOf(t, spec, seed), segs, r)
		if err != nil {
			t.Fatal(err)
		}
		w.push = append(w.push, p)
	}
	return w
}

// step pushes grads[r] from every rank r and returns the averaged
// gradient the server applies.
func (w *psWorld) step(t testing.TB, grads [][]float32, step int64) []float32 {
	t.Helper()
	avg := make([]float32, len(grads[0]))
	var pm, q []float32
	for _, ph := range w.recv.Phases(step) {
		sum := make([]float32, ph.Total)
		for r, p := range w.push {
			next := 0
			send := func(f *pb.TensorFrame) error {
				off, n, err := wire.Check(f, wire.Expect{JobID: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Total: uint64(ph.Total), DType: psstep.DType(ph.Encoding)})
				if err != nil {
					return err
				}
				if f.Phase != ph.Phase || off != next || int(f.Rank) != r {
					t.Fatalf("rank %d: frame of phase %d at %d, want phase %d at %d", r, f.Phase, off, ph.Phase, next)
				}
				next = off + n
				if f.Last != (next == ph.Total) {
					t.Fatalf("rank %d: frame ending at %d of %d has last = %v", r, next, ph.Total, f.Last)
				}
				return w.recv.DecodeAdd(sum[off:off+n], f.Data, f.Scales, int(f.ScaleChunk), ph)
			}
			tag := &pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Rank: int32(r)}
			var err error
			if ph.Phase == 2 {
				err = p.PushQ(step, pm, psstep.FrameSender(tag, send))
			} else {
				err = p.Push(step, grads[r], psstep.FrameSender(tag, send))
			}
			if err != nil {
				t.Fatalf("step %d phase %d rank %d: %v", step, ph.Phase, r, err)
			}
		}
		switch ph.Phase {
		case 0:
			inv := 1 / float32(len(w.push))
			for i, v := range sum {
				avg[i] = v * inv
			}
		case 1:
			pm = slices.Clone(w.recv.CombineP(sum))
		case 2:
			q = slices.Clone(w.recv.CombineQ(sum, avg))
		}
	}
	for r, p := range w.push {
		if err := p.Applied(step, q); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return avg
}

// bigSegs spans several pushed frames (2^18 elements each).
var bigSegs = layout("big.weight", []int{600, 1000}, "big.bias", []int{600}, "fc.weight", []int{10, 600})

// TestPSMatchesRing: fp16, bf16, int8 and top-k pushes give the server
// the very average the ring reducers compute (the same rounding, the same
// int8 random streams, the same selection and residuals, summed in rank
// order); PowerSGD's matches to float32 accuracy (P·Qᵀ is formed in
// float64 on the server, by the GEMM backend in the ring).
func TestPSMatchesRing(t *testing.T) {
	specs := map[string]*pb.CompressionSpec{
		"fp16":     {Type: "fp16"},
		"bf16":     {Type: "bf16"},
		"int8":     {Type: "int8"},
		"topk":     {Type: "topk", Ratio: 0.02},
		"powersgd": {Type: "powersgd", Rank: 2, StartIter: 2},
	}
	for kind, spec := range specs {
		t.Run(kind, func(t *testing.T) {
			segs := bigSegs
			if kind == "powersgd" {
				segs = testSegs
			}
			const n, seed = 2, 5
			l := total(segs)
			ps := newPSWorld(t, spec, segs, n, seed)
			ring := newWorld(t, n, func(r aggregator.Ring) (compress.Reducer, error) {
				return fromSpec(spec, r, aggregator.Options{}, segs, 0, seed)
			})
			rng := rand.New(rand.NewPCG(9, 9))
			for step := range int64(4) {
				g := randGrads(rng, n, l)
				got := ps.step(t, clone2(g), step)
				ring.step(t, g, step)
				if kind == "powersgd" {
					near(t, "step "+itoa(int(step)), got, g[0], 1e-5)
					continue
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(g[0][i]) {
						t.Fatalf("step %d: element %d: ps %v, ring %v", step, i, got[i], g[0][i])
					}
				}
			}
			// The ranks' state (residuals) is the ring's too.
			for r := range n {
				want := ring.reds[r].(compress.Stateful).State()
				gotSt := ps.push[r].State()
				if len(gotSt) != len(want) {
					t.Fatalf("rank %d: state %d tensors, ring %d", r, len(gotSt), len(want))
				}
				for name, tw := range want {
					a, _ := gotSt[name].Float32s()
					b, _ := tw.Float32s()
					tol := 0.0
					if kind == "powersgd" {
						tol = 1e-5
					}
					near(t, name, a, b, tol)
				}
			}
			if st := ps.push[0].Stats(); st.Steps != 4 || st.RawBytes != 16*int64(l) || st.SentBytes <= 0 || (kind != "powersgd" && st.Ratio() < 1.9) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestPSPowerSGD: a low-rank gradient comes through PowerSGD's two phases
// as its average, every rank's residual is exactly what it meant to apply
// minus what the server applied, and the warm-start Q is the server's.
func TestPSPowerSGD(t *testing.T) {
	const n = 3
	spec := &pb.CompressionSpec{Type: "powersgd", Rank: 2, StartIter: -1}
	w := newPSWorld(t, spec, testSegs, n, 11)
	rng := rand.New(rand.NewPCG(3, 4))
	l := total(testSegs)
	g := make([][]float32, n)
	mean := make([]float32, l)
	for r := range g {
		g[r] = randVec(rng, l)
		for _, s := range testSegs[:4:4] {
			if len(s.Shape) > 1 {
				lowRank(rng, g[r], s, 1) // the ranks' sum has rank ≤ 3 > 2: not exact
			}
		}
	}
	// Identical low-rank inputs on every rank: the average is exact.
	same := [][]float32{g[0], g[0], g[0]}
	got := w.step(t, clone2(same), 0)
	for _, s := range testSegs {
		near(t, s.Name, got[s.Offset:s.Offset+s.Len], g[0][s.Offset:s.Offset+s.Len], 2e-5)
	}
	// Different inputs: residual_r = g_r + 0 − applied, bit for bit, on
	// the compressed matrices; Q is what the server sent.
	w2 := newPSWorld(t, spec, testSegs, n, 11)
	got = w2.step(t, clone2(g), 0)
	for r := range n {
		st := w2.push[r].State()
		for _, name := range []string{"conv.weight", "fc.weight"} {
			var s models.Segment
			for _, x := range testSegs {
				if x.Name == name {
					s = x
				}
			}
			e, err := st["powersgd.error."+name].Float32s()
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range e {
				if want := g[r][s.Offset+i] - got[s.Offset+i]; math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("rank %d %s[%d]: residual %v, want %v", r, name, i, v, want)
				}
			}
			if _, ok := st["powersgd.q."+name]; !ok {
				t.Errorf("rank %d: no warm-start Q for %s", r, name)
			}
		}
		// Q is shared: every rank holds the server's.
		fl := &compress.Flat{Shared: make([]float32, len(w2.recv.Shared())), Own: make([]float32, w2.recv.OwnLen())}
		w2.push[r].CopyState(fl)
		if !fl.SharedSet || !slices.Equal(fl.Shared, w2.recv.Shared()) {
			t.Errorf("rank %d: warm-start Q differs from the server's", r)
		}
	}
	for i := range mean {
		for r := range n {
			mean[i] += g[r][i] / n
		}
	}
	// The uncompressed tensors are averaged exactly as float32 sums.
	for _, s := range testSegs {
		if s.Name == "conv.bias" || s.Name == "fc.bias" || s.Name == "small.weight" {
			near(t, s.Name, got[s.Offset:s.Offset+s.Len], mean[s.Offset:s.Offset+s.Len], 1e-6)
		}
	}
}

// TestPSFP16Exact: values fp16 represents arrive exactly, and their
// average is the float32 average.
func TestPSFP16Exact(t *testing.T) {
	segs := layout("w", []int{300000})
	w := newPSWorld(t, &pb.CompressionSpec{Type: "fp16"}, segs, 2, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	g := [][]float32{make([]float32, 300000), make([]float32, 300000)}
	for r := range g {
		for i := range g[r] {
			g[r][i] = float32(int(rng.Uint32()%4001)-2000) / 1024 // 11 significant bits at most
		}
	}
	got := w.step(t, clone2(g), 0)
	for i := range got {
		if want := (g[0][i] + g[1][i]) * 0.5; got[i] != want {
			t.Fatalf("element %d: %v, want %v", i, got[i], want)
		}
	}
	if st := w.push[0].Stats(); st.SentBytes != 2*300000 || st.Ratio() != 2 {
		t.Errorf("stats %+v: want 600000 bytes sent, ratio 2", st)
	}
}

// TestPSStartIter: steps before start_iter push plain float32.
func TestPSStartIter(t *testing.T) {
	for _, typ := range []string{"powersgd", "topk", "int8", "fp16", "bf16"} {
		r, err := compress.NewPSReceiver(schemeOf(t, &pb.CompressionSpec{Type: typ, StartIter: 3}, 0), testSegs, 2)
		if err != nil {
			t.Fatal(err)
		}
		if ph := r.Phases(2); len(ph) != 1 || ph[0].Encoding != compress.PSF32 || ph[0].Phase != 0 || ph[0].Total != total(testSegs) {
			t.Errorf("%s step 2: %+v, want one plain push", typ, ph)
		}
		if ph := r.Phases(3); ph[0].Encoding == compress.PSF32 && ph[0].Phase == 0 {
			t.Errorf("%s step 3: %+v, want compressed", typ, ph)
		}
	}
}

// TestPSDecodeRejects: malformed compressed frames are errors.
func TestPSDecodeRejects(t *testing.T) {
	le := func(v ...uint32) []byte {
		var b []byte
		for _, x := range v {
			b = append(b, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
		}
		return b
	}
	dst := make([]float32, 8)
	for name, err := range map[string]error{
		"odd f16":           compress.AddHalf(dst, make([]byte, 15), compress.FP16),
		"short bf16":        compress.AddHalf(dst, make([]byte, 4), compress.BF16),
		"sparse not pairs":  compress.AddSparse(dst, make([]byte, 12)),
		"sparse out":        compress.AddSparse(dst, le(8, 0)),
		"sparse descending": compress.AddSparse(dst, le(3, 0, 2, 0)),
		"sparse repeated":   compress.AddSparse(dst, le(3, 0, 3, 0)),
		"i8 chunk 0":        compress.DequantizeInt8Add(dst, make([]byte, 8), le(0), 0),
		"i8 short":          compress.DequantizeInt8Add(dst, make([]byte, 7), le(0), 8),
		"i8 scales":         compress.DequantizeInt8Add(dst, make([]byte, 8), le(0), 4),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzPSDecode: whatever a frame holds, decoding it never panics and
// never writes outside the range wire.Check gave it.
func FuzzPSDecode(f *testing.F) {
	segs := layout("w", []int{16, 16})
	f.Add(int32(pb.DType_D_TYPE_I8), []byte{1, 2, 3}, []byte{0, 0, 128, 63}, uint32(4), uint64(0), uint64(0))
	f.Add(int32(pb.DType_D_TYPE_SPARSE_F32), []byte{1, 0, 0, 0, 0, 0, 128, 63}, []byte(nil), uint32(0), uint64(8), uint64(4))
	f.Add(int32(pb.DType_D_TYPE_F16), []byte{0, 60, 0, 60}, []byte(nil), uint32(0), uint64(0), uint64(250))
	f.Fuzz(func(t *testing.T, dtype int32, data, scales []byte, chunk uint32, span, off uint64) {
		fr := &pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PUSH_GRADIENT, Total: 256, Dtype: pb.DType(dtype), Data: data,
			Scales: scales, ScaleChunk: chunk, Span: span, Offset: off}
		typ := map[pb.DType]string{pb.DType_D_TYPE_F16: "fp16", pb.DType_D_TYPE_BF16: "bf16", pb.DType_D_TYPE_I8: "int8",
			pb.DType_D_TYPE_SPARSE_F32: "topk"}[fr.Dtype]
		if typ == "" {
			typ = "none"
		}
		r, err := compress.NewPSReceiver(schemeOf(t, &pb.CompressionSpec{Type: typ}, 0), segs, 2)
		if err != nil {
			t.Skip()
		}
		ph := r.Phases(0)[0]
		o, n, err := wire.Check(proto.Clone(fr).(*pb.TensorFrame), wire.Expect{JobID: "j", Op: pb.Op_OP_PUSH_GRADIENT, Total: 256, DType: psstep.DType(ph.Encoding)})
		if err != nil {
			return
		}
		buf := make([]float32, 256+2)
		_ = r.DecodeAdd(buf[1+o:1+o+n], fr.Data, fr.Scales, int(fr.ScaleChunk), ph)
		if buf[0] != 0 || buf[257] != 0 {
			t.Fatal("decoding wrote outside its range")
		}
	})
}
