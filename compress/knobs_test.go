package compress_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// checkRounding verifies that enc rounds x to a nearest representable
// value, ties to an even encoding, by comparing with both neighbours.
func checkRounding(t *testing.T, x float32, enc func(float32) uint16, dec func(uint16) float32, maxFinite uint16) {
	t.Helper()
	h := enc(x)
	v := dec(h)
	mag := h &^ 0x8000
	if mag > maxFinite { // Inf: only when x rounds beyond the largest finite value
		top := float64(dec(maxFinite))
		ulp := top - float64(dec(maxFinite-1))
		if math.Abs(float64(x)) < top+ulp/2 {
			t.Fatalf("%v (%#x) became %v", x, math.Float32bits(x), v)
		}
		return
	}
	if math.Signbit(float64(v)) != math.Signbit(float64(x)) {
		t.Fatalf("%v: sign lost (%v)", x, v)
	}
	d := math.Abs(float64(x) - float64(v))
	for _, nb := range []uint16{mag - 1, mag + 1} {
		if mag == 0 && nb == 0xffff || nb > maxFinite {
			continue
		}
		dn := math.Abs(math.Abs(float64(x)) - float64(dec(nb)))
		if dn < d || dn == d && mag&1 == 1 {
			t.Fatalf("%v (%#x) rounded to %v (%#x), but %v (%#x) is nearer or the even tie", x, math.Float32bits(x), v, h, dec(nb), nb)
		}
	}
}

func TestHalfRounding(t *testing.T) {
	for _, f := range []struct {
		name      string
		enc       func(float32) uint16
		dec       func(uint16) float32
		maxFinite uint16
		maxExp    int // 2^maxExp overflows
		extra     int // binary digits below the smallest normal
	}{
		{"fp16", compress.F32ToF16, compress.F16ToF32, 0x7bff, 16, 12},
		{"bf16", compress.F32ToBF16, compress.BF16ToF32, 0x7f7f, 128, 0},
	} {
		t.Run(f.name, func(t *testing.T) {
			// Every finite 16-bit value round-trips exactly.
			for h := range 1 << 16 {
				h := uint16(h)
				v := f.dec(h)
				if math.IsNaN(float64(v)) {
					if got := f.enc(v); !math.IsNaN(float64(f.dec(got))) {
						t.Fatalf("NaN %#x became %#x", h, got)
					}
					continue
				}
				if got := f.enc(v); got != h {
					t.Fatalf("%#x (%v) round-tripped to %#x", h, v, got)
				}
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for range 200000 {
				// Random magnitudes across the whole range, subnormals
				// included, and values just around the overflow threshold.
				x := float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(2*f.maxExp+f.extra)-f.maxExp-f.extra+2))
				if rng.IntN(2) == 0 {
					x = -x
				}
				checkRounding(t, x, f.enc, f.dec, f.maxFinite)
				// The midpoints between neighbours must go to the even one.
				h := f.enc(x) &^ 0x8000
				if h < f.maxFinite {
					mid := float32((float64(f.dec(h)) + float64(f.dec(h+1))) / 2)
					checkRounding(t, mid, f.enc, f.dec, f.maxFinite)
				}
			}
		})
	}
	// Fixed cases.
	for _, c := range []struct {
		x    float32
		want uint16
	}{
		{65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{0x1p-24, 0x0001}, {0x1p-25, 0}, {0x1.8p-24, 0x0002}, {0x1.8p-23, 0x0003}, {0x1.4p-23, 0x0002}, {0x1p-14, 0x0400},
		{float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3c00}, {1 + 0x1p-11, 0x3c00}, {1 + 0x3p-11, 0x3c02},
	} {
		if got := compress.F32ToF16(c.x); got != c.want {
			t.Errorf("F32ToF16(%v) = %#x, want %#x", c.x, got, c.want)
		}
	}
	if got := compress.F32ToBF16(1 + 0x1p-8); got != 0x3f80 {
		t.Errorf("F32ToBF16(1+2^-8) = %#x, want 0x3f80 (tie to even)", got)
	}
	if got := compress.F32ToBF16(1 + 0x3p-8); got != 0x3f82 {
		t.Errorf("F32ToBF16(1+3·2^-8) = %#x, want 0x3f82 (tie to even)", got)
	}
}

// TestCastReduce: on one rank the result is the input rounded to 16 bits;
// on several, the float32 sum of the rounded inputs over n.
func TestCastReduce(t *testing.T) {
	l := total(testSegs)
	for _, kind := range []string{"fp16", "bf16"} {
		enc, dec := compress.F32ToF16, compress.F16ToF32
		if kind == "bf16" {
			enc, dec = compress.F32ToBF16, compress.BF16ToF32
		}
		for n := 1; n <= 4; n++ {
			t.Run(name(kind, n), func(t *testing.T) {
				w := newWorld(t, n, kinds(testSegs)[kind])
				g := randGrads(rand.New(rand.NewPCG(8, uint64(n))), n, l)
				in := clone2(g)
				w.step(t, g, 0)
				for i := range l {
					var want float32
					for r := range n {
						want += dec(enc(in[r][i]))
					}
					want *= 1 / float32(n)
					if g[0][i] != want {
						t.Fatalf("element %d: %v, want %v", i, g[0][i], want)
					}
				}
				if st := w.reds[0].Stats(); st.SentBytes != int64(2*l+2*(l%2)) {
					t.Errorf("sent %d bytes for %d elements", st.SentBytes, l)
				}
			})
		}
	}
}

// TestStartIter: before start_iter every scheme is the plain all-reduce,
// bit for bit, and counts raw bytes; from it on, it compresses.
func TestStartIter(t *testing.T) {
	l := total(testSegs)
	const start = 2
	mks := map[string]factory{
		"powersgd": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewPowerSGD(r, aggregator.Options{}, testSegs, 256, compress.PowerSGDConfig{StartIter: start})
		},
		"topk": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewTopK(r, aggregator.Options{}, testSegs, 256, compress.TopKConfig{StartIter: start})
		},
		"int8": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewInt8(r, aggregator.Options{}, testSegs, 256, compress.Int8Config{StartIter: start})
		},
		"fp16": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewCast(r, aggregator.Options{}, testSegs, 256, compress.FP16, compress.CastConfig{StartIter: start})
		},
	}
	for kind, mk := range mks {
		n := 3
		t.Run(name(kind, n), func(t *testing.T) {
			w := newWorld(t, n, mk)
			plain := newWorld(t, n, func(r aggregator.Ring) (compress.Reducer, error) {
				return compress.NewPlain(r, aggregator.Options{}, testSegs, 256), nil
			})
			rng := rand.New(rand.NewPCG(2, 2))
			for step := range int64(start + 1) {
				g := randGrads(rng, n, l)
				want := clone2(g)
				w.step(t, g, step)
				plain.step(t, want, step)
				same := slices.EqualFunc(g[0], want[0], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })
				st := w.reds[0].Stats()
				if step < start {
					if !same || st.SentBytes != st.RawBytes {
						t.Fatalf("step %d < start_iter: same as plain %v, stats %+v", step, same, st)
					}
				} else if same || st.SentBytes >= st.RawBytes {
					t.Fatalf("step %d ≥ start_iter: same as plain %v, stats %+v", step, same, st)
				}
			}
		})
	}
}

// TestMinCompressionRate: a rows×cols matrix is compressed only if
// (rows+cols)·r·rate < rows·cols; one that is not comes back exactly.
func TestMinCompressionRate(t *testing.T) {
	segs := layout("a", []int{8, 8}, "b", []int{8, 2, 2, 2}, "c", []int{3, 100}, "v", []int{50})
	for _, c := range []struct {
		rate float64
		want []string
	}{
		// r=2: a: 16·2·rate vs 64; b (8×8 too); c: 103·2·rate vs 300.
		{1, []string{"a", "b", "c"}},
		{1.4, []string{"a", "b", "c"}},
		{1.5, []string{"a", "b"}}, // c: 309 ≥ 300
		{2, nil},                  // a, b: 64 ≥ 64
	} {
		for n := 1; n <= 2; n++ {
			w := newWorld(t, n, powerSGD(compress.PowerSGDConfig{MinCompressionRate: c.rate}, segs))
			if got := w.reds[0].(*compress.PowerSGD).Compressed(); !slices.Equal(got, c.want) {
				t.Fatalf("rate %v: compressed %v, want %v", c.rate, got, c.want)
			}
			g := randGrads(rand.New(rand.NewPCG(1, 1)), n, total(segs))
			in := clone2(g)
			w.step(t, g, 0)
			for _, s := range segs {
				if slices.Contains(c.want, s.Name) {
					continue
				}
				for i := s.Offset; i < s.Offset+s.Len; i++ {
					var want float32
					for r := range n {
						want += in[r][i]
					}
					if n == 1 && g[0][i] != want || math.Abs(float64(g[0][i]-want/float32(n))) > 1e-6 {
						t.Fatalf("rate %v n=%d: uncompressed %s element %d = %v, want the average %v", c.rate, n, s.Name, i, g[0][i], want/float32(n))
					}
				}
			}
		}
	}
}

func cnnSegments(t testing.TB) []models.Segment {
	net, err := models.New("cnn", models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return net.Segments()
}

// TestCNNRatio: PowerSGD at rank 2 compresses the cnn model's gradient by
// at least 50×.
func TestCNNRatio(t *testing.T) {
	segs := cnnSegments(t)
	l := total(segs)
	for _, r := range []int{1, 2, 4} {
		w := newWorld(t, 1, powerSGD(compress.PowerSGDConfig{Rank: r}, segs))
		w.step(t, [][]float32{randVec(rand.New(rand.NewPCG(1, 1)), l)}, 0)
		st := w.reds[0].Stats()
		t.Logf("cnn (%d parameters), powersgd rank %d: %d → %d bytes per step, ratio %.2f×, compressed %v",
			l, r, st.RawBytes, st.SentBytes, st.Ratio(), w.reds[0].(*compress.PowerSGD).Compressed())
		if r == 2 && st.Ratio() < 50 {
			t.Errorf("rank 2 ratio %.2f×, want ≥ 50×", st.Ratio())
		}
	}
}

// TestWireBytes: WireBytes counts what the ring really carried.
func TestWireBytes(t *testing.T) {
	segs := layout("x", []int{1000})
	w := newWorld(t, 2, func(r aggregator.Ring) (compress.Reducer, error) {
		return compress.NewPlain(r, aggregator.Options{}, segs, 0), nil
	})
	w.step(t, randGrads(rand.New(rand.NewPCG(1, 1)), 2, 1000), 0)
	if got := w.reds[0].Stats().WireBytes; got != 4000 { // 500 floats each way of the 2 ring steps
		t.Errorf("plain, 2 ranks: %d wire bytes, want 4000", got)
	}
	w = newWorld(t, 3, func(r aggregator.Ring) (compress.Reducer, error) {
		return compress.NewTopK(r, aggregator.Options{}, segs, 0, compress.TopKConfig{Ratio: 0.01})
	})
	w.step(t, randGrads(rand.New(rand.NewPCG(1, 1)), 3, 1000), 0)
	if got := w.reds[0].Stats().WireBytes; got != 2*10*8 { // n−1 = 2 blocks of 10 pairs
		t.Errorf("topk, 3 ranks: %d wire bytes, want 160", got)
	}
}

// TestState: a reducer restored from another's State continues exactly as
// the original does.
func TestState(t *testing.T) {
	l := total(testSegs)
	for _, kind := range []string{"powersgd", "topk", "int8"} {
		t.Run(kind, func(t *testing.T) {
			mk := kinds(testSegs)[kind]
			a := newWorld(t, 1, mk)
			rng := rand.New(rand.NewPCG(4, 4))
			for step := range int64(3) {
				a.step(t, [][]float32{randVec(rng, l)}, step)
			}
			st := a.reds[0].(compress.Stateful).State()
			if kind != "int8" && len(st) == 0 {
				t.Fatal("empty state")
			}
			b := newWorld(t, 1, mk)
			if err := b.reds[0].(compress.Stateful).SetState(st); err != nil {
				t.Fatal(err)
			}
			g := randVec(rng, l)
			ga, gb := [][]float32{slices.Clone(g)}, [][]float32{slices.Clone(g)}
			a.step(t, ga, 3)
			b.step(t, gb, 3)
			if !slices.Equal(ga[0], gb[0]) {
				t.Fatal("restored reducer diverged")
			}
			bad := map[string]models.Tensor{"nope": models.F32Tensor([]int{1}, []float32{1})}
			if err := b.reds[0].(compress.Stateful).SetState(bad); err == nil {
				t.Error("SetState accepted an unknown tensor")
			}
		})
	}
	// Wrong shape.
	w := newWorld(t, 1, kinds(testSegs)["powersgd"])
	bad := map[string]models.Tensor{"powersgd.error.fc.weight": models.F32Tensor([]int{2}, []float32{1, 2})}
	if err := w.reds[0].(compress.Stateful).SetState(bad); err == nil || !strings.Contains(err.Error(), "shape") {
		t.Errorf("SetState with a wrong shape: %v", err)
	}
}

// TestNew maps the spec's types and defaults, and rejects bad knobs.
func TestNew(t *testing.T) {
	ring := aggregator.NewMemRing(1, 0)[0]
	tr, f := true, false
	good := []struct {
		spec *pb.CompressionSpec
		want string
	}{
		{nil, "*compress.Plain"},
		{&pb.CompressionSpec{Type: "none"}, "*compress.Plain"},
		{&pb.CompressionSpec{Type: "powersgd"}, "*compress.PowerSGD"},
		{&pb.CompressionSpec{Type: "powersgd", Rank: 4, StartIter: -1, ErrorFeedback: &f, WarmStart: &tr, MinCompressionRate: 1}, "*compress.PowerSGD"},
		{&pb.CompressionSpec{Type: "topk", Ratio: 0.1, ErrorFeedback: &f}, "*compress.TopK"},
		{&pb.CompressionSpec{Type: "int8"}, "*compress.Int8"},
		{&pb.CompressionSpec{Type: "fp16"}, "*compress.Cast"},
		{&pb.CompressionSpec{Type: "bf16", StartIter: 5}, "*compress.Cast"},
	}
	for _, c := range good {
		red, err := fromSpec(c.spec, ring, aggregator.Options{}, testSegs, 0, 1)
		if err != nil {
			t.Errorf("%v: %v", c.spec, err)
			continue
		}
		if got := typeName(red); got != c.want {
			t.Errorf("%v: %s, want %s", c.spec, got, c.want)
		}
	}
	// Defaults: powersgd compresses from step 10 at rank 2.
	red, _ := fromSpec(&pb.CompressionSpec{Type: "powersgd"}, ring, aggregator.Options{}, testSegs, 0, 1)
	l := total(testSegs)
	w := &world{n: 1, reds: []compress.Reducer{red}}
	for step := range int64(11) {
		w.step(t, [][]float32{randVec(rand.New(rand.NewPCG(1, uint64(step))), l)}, step)
		st := red.Stats()
		if compressed := st.SentBytes < st.RawBytes; compressed != (step >= 10) {
			t.Fatalf("default powersgd at step %d: compressed = %v", step, compressed)
		}
	}
	// Rank 2: conv.weight 12×27 and fc.weight 20×30 send (39+50)·2 floats.
	if got, want := red.(*compress.PowerSGD).MessageBytes(), int64(4*((12+27+20+30)*2+12+20+16)); got != want {
		t.Errorf("default rank: message %d bytes, want %d (rank 2)", got, want)
	}
	tk, _ := fromSpec(&pb.CompressionSpec{Type: "topk"}, ring, aggregator.Options{}, layout("x", []int{1000}), 0, 1)
	if k := tk.(*compress.TopK).K(); k != 10 {
		t.Errorf("default topk k = %d for 1000 elements, want 10", k)
	}
	bad := []struct {
		spec *pb.CompressionSpec
		msg  string
	}{
		{&pb.CompressionSpec{Type: "zip"}, "unknown compression type"},
		{&pb.CompressionSpec{Rank: 2}, "rank does not apply"},
		{&pb.CompressionSpec{Type: "powersgd", Rank: -1}, "rank"},
		{&pb.CompressionSpec{Type: "powersgd", Ratio: 0.1}, "ratio does not apply"},
		{&pb.CompressionSpec{Type: "powersgd", MinCompressionRate: -1}, "min_compression_rate"},
		{&pb.CompressionSpec{Type: "topk", Ratio: 1.5}, "ratio"},
		{&pb.CompressionSpec{Type: "topk", Rank: 1}, "rank does not apply"},
		{&pb.CompressionSpec{Type: "int8", ErrorFeedback: &tr}, "error_feedback does not apply"},
		{&pb.CompressionSpec{Type: "fp16", WarmStart: &tr}, "warm_start does not apply"},
	}
	for _, c := range bad {
		if _, err := fromSpec(c.spec, ring, aggregator.Options{}, testSegs, 0, 1); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: error %v, want one mentioning %q", c.spec, err, c.msg)
		}
	}
	badSegs := []models.Segment{{Name: "x", Shape: []int{2}, Offset: 1, Len: 2}}
	if _, err := fromSpec(nil, ring, aggregator.Options{}, badSegs, 0, 1); err == nil {
		t.Error("New accepted segments that do not tile the buffer")
	}
}

// TestNewScheme: a Scheme built directly, without the job spec: the zero
// value is the plain all-reduce, the configs are taken literally, and an
// unknown type is an error in every constructor.
func TestNewScheme(t *testing.T) {
	ring := aggregator.NewMemRing(1, 0)[0]
	for _, c := range []struct {
		sc   compress.Scheme
		want string
	}{
		{compress.Scheme{}, "*compress.Plain"},
		{compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{Rank: 1}}, "*compress.PowerSGD"},
		{compress.Scheme{Type: "topk"}, "*compress.TopK"},
		{compress.Scheme{Type: "int8"}, "*compress.Int8"},
		{compress.Scheme{Type: "bf16", Cast: compress.CastConfig{StartIter: 2}}, "*compress.Cast"},
	} {
		red, err := compress.New(c.sc, ring, aggregator.Options{}, testSegs, 0)
		if err != nil {
			t.Errorf("%+v: %v", c.sc, err)
			continue
		}
		if got := typeName(red); got != c.want {
			t.Errorf("%+v: %s, want %s", c.sc, got, c.want)
		}
	}
	// Literal start: the zero PowerSGDConfig compresses from step 0.
	red, err := compress.New(compress.Scheme{Type: "powersgd"}, ring, aggregator.Options{}, testSegs, 0)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{n: 1, reds: []compress.Reducer{red}}
	w.step(t, [][]float32{randVec(rand.New(rand.NewPCG(1, 2)), total(testSegs))}, 0)
	if st := red.Stats(); st.SentBytes >= st.RawBytes {
		t.Errorf("zero PowerSGDConfig at step 0: stats %+v, want compressed", st)
	}
	zip := compress.Scheme{Type: "zip"}
	const msg = `unknown compression type "zip"`
	if _, err := compress.New(zip, ring, aggregator.Options{}, testSegs, 0); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("New: error %v, want one mentioning %q", err, msg)
	}
	if _, err := compress.NewPSReceiver(zip, testSegs, 2); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("NewPSReceiver: error %v, want one mentioning %q", err, msg)
	}
	if _, err := compress.NewPSPusher(zip, testSegs, 0); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("NewPSPusher: error %v, want one mentioning %q", err, msg)
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *compress.Plain:
		return "*compress.Plain"
	case *compress.PowerSGD:
		return "*compress.PowerSGD"
	case *compress.TopK:
		return "*compress.TopK"
	case *compress.Int8:
		return "*compress.Int8"
	case *compress.Cast:
		return "*compress.Cast"
	}
	return "?"
}

// TestFlatState: CopyState/RestoreState carry the same state as
// State/SetState, a restored reducer continues exactly, SharedSet follows
// PowerSGD's warm start, and wrong lengths are refused.
func TestFlatState(t *testing.T) {
	l := total(testSegs)
	for kind, mk := range kinds(testSegs) {
		t.Run(kind, func(t *testing.T) {
			a := newWorld(t, 1, mk)
			rng := rand.New(rand.NewPCG(5, 5))
			for step := range int64(3) {
				a.step(t, [][]float32{randVec(rng, l)}, step)
			}
			sa := a.reds[0].(compress.Stateful)
			ns, no := sa.FlatLen()
			fl := &compress.Flat{Shared: make([]float32, ns), Own: make([]float32, no)}
			sa.CopyState(fl)
			if want := kind == "powersgd"; fl.SharedSet != want || (ns > 0) != want {
				t.Errorf("SharedSet %v with %d shared values; want %v", fl.SharedSet, ns, want)
			}
			var shared, own int
			for name, tn := range sa.State() {
				if compress.SharedStateName(name) {
					shared += len(tn.Data) / 4
				} else {
					own += len(tn.Data) / 4
				}
			}
			if shared != ns || own != no {
				t.Errorf("FlatLen (%d, %d), State holds (%d, %d)", ns, no, shared, own)
			}
			b := newWorld(t, 1, mk)
			sb := b.reds[0].(compress.Stateful)
			if err := sb.RestoreState(fl); err != nil {
				t.Fatal(err)
			}
			g := randVec(rng, l)
			ga, gb := [][]float32{slices.Clone(g)}, [][]float32{slices.Clone(g)}
			a.step(t, ga, 3)
			b.step(t, gb, 3)
			if !slices.Equal(ga[0], gb[0]) {
				t.Fatal("restored reducer diverged")
			}
			if err := sb.RestoreState(&compress.Flat{Shared: make([]float32, ns+1), SharedSet: true, Own: make([]float32, no+1)}); err == nil {
				t.Error("RestoreState accepted wrong lengths")
			}
		})
	}
}
