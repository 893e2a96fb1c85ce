package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// A scalerSegment is n steps of one kind (finite gradients or not) and the
// scaler's state after them.
type scalerSegment struct {
	n            int
	finite       bool
	scale        float32
	tracker      int32
	stepped, skp int64
}

func runScript(t *testing.T, s *LossScaler, script []scalerSegment) {
	t.Helper()
	for i, seg := range script {
		for range seg.n {
			if step := s.Update(seg.finite); step != seg.finite {
				t.Fatalf("segment %d: Update(%v) = %v", i, seg.finite, step)
			}
		}
		want := ScalerState{Scale: seg.scale, GrowthTracker: seg.tracker, Stepped: seg.stepped, Skipped: seg.skp}
		if got := s.State(); got != want {
			t.Fatalf("segment %d (%d × finite=%v): state %+v, want %+v", i, seg.n, seg.finite, got, want)
		}
	}
}

func TestLossScalerScripts(t *testing.T) {
	const c, x = true, false // a clean step, one with inf/NaN gradients
	tests := []struct {
		name   string
		cfg    ScalerConfig
		script []scalerSegment
	}{
		{"growth after 2000 clean steps", ScalerConfig{}, []scalerSegment{
			{0, c, 1 << 16, 0, 0, 0},
			{1999, c, 1 << 16, 1999, 1999, 0},
			{1, c, 1 << 17, 0, 2000, 0},
			{1999, c, 1 << 17, 1999, 3999, 0},
			{1, c, 1 << 18, 0, 4000, 0},
		}},
		{"back-off", ScalerConfig{}, []scalerSegment{
			{1, x, 1 << 15, 0, 0, 1},
			{1, c, 1 << 15, 1, 1, 1},
		}},
		{"repeated back-offs", ScalerConfig{}, []scalerSegment{
			{3, x, 1 << 13, 0, 0, 3},
			{5, c, 1 << 13, 5, 5, 3},
			{2, x, 1 << 11, 0, 5, 5},
		}},
		{"growth then back-off", ScalerConfig{}, []scalerSegment{
			{2000, c, 1 << 17, 0, 2000, 0},
			{1, x, 1 << 16, 0, 2000, 1},
		}},
		{"a back-off restarts the count", ScalerConfig{}, []scalerSegment{
			{1999, c, 1 << 16, 1999, 1999, 0},
			{1, x, 1 << 15, 0, 1999, 1},
			{1999, c, 1 << 15, 1999, 3998, 1},
			{1, c, 1 << 16, 0, 3999, 1},
		}},
		{"no growth past float32", ScalerConfig{InitScale: 0x1p127, GrowthInterval: 1}, []scalerSegment{
			{1, c, 0x1p127, 0, 1, 0},
			{3, c, 0x1p127, 0, 4, 0},
			{1, x, 0x1p126, 0, 4, 1},
			{1, c, 0x1p127, 0, 5, 1},
		}},
		{"backs off to subnormals and 0", ScalerConfig{}, []scalerSegment{
			{16 + 126, x, 0x1p-126, 0, 0, 142},
			{23, x, 0x1p-149, 0, 0, 165},
			{1, x, 0, 0, 0, 166}, // 2^-150 ties to even: 0
			{1, x, 0, 0, 0, 167},
			{2000, c, 0, 0, 2000, 167},
		}},
		{"other factors round through float64", ScalerConfig{InitScale: 3, GrowthFactor: 1.1, BackoffFactor: 0.3, GrowthInterval: 2}, []scalerSegment{
			{2, c, float32(3 * 1.1), 0, 2, 0},
			{1, c, float32(3 * 1.1), 1, 3, 0},
			{1, x, float32(float64(float32(3*1.1)) * 0.3), 0, 3, 1},
			{2, c, float32(float64(float32(float64(float32(3*1.1))*0.3)) * 1.1), 0, 5, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewLossScaler(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			runScript(t, s, tt.script)
		})
	}
}

// TestLossScalerMatchesAlgorithm replays random scripts against a literal
// transcription of _amp_update_scale_ (float scale, int tracker, double
// factors).
func TestLossScalerMatchesAlgorithm(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, cfg := range []ScalerConfig{{}, {GrowthInterval: 3}, {InitScale: 0x1p120, GrowthFactor: 4, BackoffFactor: 0.25, GrowthInterval: 2}} {
		s, err := NewLossScaler(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := s.Config()
		scale, tracker := c.InitScale, int32(0)
		for i := range 20000 {
			foundInf := r.IntN(500) == 0
			if c.GrowthInterval < 10 {
				foundInf = r.IntN(4) == 0
			}
			if foundInf {
				scale = float32(float64(scale) * c.BackoffFactor)
				tracker = 0
			} else {
				successful := tracker + 1
				if int(successful) == c.GrowthInterval {
					newScale := float32(float64(scale) * c.GrowthFactor)
					if !math.IsInf(float64(newScale), 0) && !math.IsNaN(float64(newScale)) {
						scale = newScale
					}
					tracker = 0
				} else {
					tracker = successful
				}
			}
			s.Update(!foundInf)
			if st := s.State(); st.Scale != scale || st.GrowthTracker != tracker {
				t.Fatalf("%+v step %d: scale %v tracker %d, want %v, %d", cfg, i, st.Scale, st.GrowthTracker, scale, tracker)
			}
		}
	}
}

func TestLossScalerStateRoundTrip(t *testing.T) {
	a, _ := NewLossScaler(ScalerConfig{GrowthInterval: 5})
	for _, f := range []bool{true, true, false, true, true, true} {
		a.Update(f)
	}
	st := a.State()
	if want := (ScalerState{Scale: 1 << 15, GrowthTracker: 3, Stepped: 5, Skipped: 1}); st != want {
		t.Fatalf("state %+v, want %+v", st, want)
	}
	b, _ := NewLossScaler(ScalerConfig{GrowthInterval: 5})
	if err := b.Restore(st); err != nil {
		t.Fatal(err)
	}
	// Both continue alike: the growth lands after 2 more clean steps.
	for i, f := range []bool{true, true, false, true} {
		if a.Update(f) != b.Update(f) || a.State() != b.State() {
			t.Fatalf("step %d: %+v and restored %+v differ", i, a.State(), b.State())
		}
	}
	if got := b.State(); got != (ScalerState{Scale: 1 << 15, GrowthTracker: 1, Stepped: 8, Skipped: 2}) {
		t.Fatalf("restored scaler ended at %+v", got)
	}
}

func TestLossScalerRestoreRefusesBadState(t *testing.T) {
	s, _ := NewLossScaler(ScalerConfig{})
	before := s.State()
	for _, st := range []ScalerState{
		{Scale: float32(math.NaN())},
		{Scale: -1},
		{Scale: 1, GrowthTracker: -1},
		{Scale: 1, GrowthTracker: DefaultGrowthInterval},
		{Scale: 1, Stepped: -1},
		{Scale: 1, Skipped: -2},
	} {
		if err := s.Restore(st); err == nil || !strings.HasPrefix(err.Error(), "optim: ") {
			t.Errorf("Restore(%+v) = %v, want an optim: error", st, err)
		}
		if s.State() != before {
			t.Fatalf("a refused Restore(%+v) changed the state to %+v", st, s.State())
		}
	}
	if err := s.Restore(ScalerState{}); err != nil {
		t.Errorf("Restore of a scale backed off to 0: %v", err)
	}
}

func TestScalerConfigValidate(t *testing.T) {
	for _, cfg := range []ScalerConfig{
		{InitScale: -1}, {InitScale: float32(math.Inf(1))}, {InitScale: float32(math.NaN())},
		{GrowthFactor: 1}, {GrowthFactor: 0.5}, {GrowthFactor: math.Inf(1)},
		{BackoffFactor: 1}, {BackoffFactor: -0.5}, {BackoffFactor: math.NaN()},
		{GrowthInterval: -1}, {GrowthInterval: math.MaxInt32 + 1},
	} {
		if _, err := NewLossScaler(cfg); err == nil {
			t.Errorf("NewLossScaler(%+v) accepted", cfg)
		}
	}
	s, err := NewLossScaler(ScalerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c != (ScalerConfig{InitScale: 65536, GrowthFactor: 2, BackoffFactor: 0.5, GrowthInterval: 2000}) {
		t.Errorf("defaults %+v", c)
	}
}

// unscaleRef is the check and the multiplication, one value at a time.
func unscaleRef(g []float32, inv float32) bool {
	finite := true
	for i, v := range g {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			finite = false
		}
		if inv != 1 {
			g[i] = v * inv
		}
	}
	return finite
}

func TestUnscaleKernelsMatchGo(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	bad := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345)}
	kernels := []struct {
		name         string
		avx512, avx2 bool
	}{{"avx512", unscaleAVX512, unscaleAVX2}, {"avx2", false, unscaleAVX2}, {"go", false, false}}
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			defer func(a, b bool) { unscaleAVX512, unscaleAVX2 = a, b }(unscaleAVX512, unscaleAVX2)
			unscaleAVX512, unscaleAVX2 = k.avx512, k.avx2
			for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 33, 1001} {
				for _, inv := range []float32{1, 0x1p-16, 1 / 3.0, float32(math.Inf(1))} {
					// Clean, and with one bad value at each of a few
					// places: first, in the vector part, last (the
					// scalar tail when n is not a multiple of 8).
					for _, at := range []int{-1, 0, n / 2, n - 1} {
						if at >= n {
							continue
						}
						name := fmt.Sprintf("n=%d/inv=%v/bad@%d", n, inv, at)
						g := make([]float32, n)
						for i := range g {
							g[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(60)-30))
							if i%11 == 3 {
								g[i] = math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal
							}
						}
						if at >= 0 {
							g[at] = bad[r.IntN(len(bad))]
						}
						want := append([]float32(nil), g...)
						wantFinite := unscaleRef(want, inv)
						if got := Unscale(g, inv); got != wantFinite {
							t.Fatalf("%s: finite = %v, want %v", name, got, wantFinite)
						}
						for i := range g {
							if math.Float32bits(g[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s: g[%d] = %#08x, want %#08x", name, i, math.Float32bits(g[i]), math.Float32bits(want[i]))
							}
						}
					}
				}
			}
		})
	}
}

func TestLossScalerUnscale(t *testing.T) {
	s, _ := NewLossScaler(ScalerConfig{InitScale: 3})
	g := []float32{3, 6, -9}
	if !s.Unscale(g) {
		t.Fatal("finite gradients reported non-finite")
	}
	inv := float32(1 / 3.0)
	for i, want := range []float32{3 * inv, 6 * inv, -9 * inv} {
		if g[i] != want {
			t.Errorf("g[%d] = %v, want %v", i, g[i], want)
		}
	}
}
