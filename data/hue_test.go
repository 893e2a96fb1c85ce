package data

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// refHue is the hue rotation from its definition, in float64 and by
// another route than torchvision's: the hexcone HSV of the pixel (V =
// max, C = max − min, H = 60°·H′ by which channel is largest), H turned
// by f·360°, and back by the closed form R, G, B = F(5), F(3), F(1) with
// F(n) = V − V·S·max(0, min(k, 4 − k, 1)), k = (n + H/60) mod 6.
func refHue(r, g, b, f float64) (float64, float64, float64) {
	v := max(r, g, b)
	c := v - min(r, g, b)
	if c == 0 {
		return r, g, b
	}
	var hp float64
	switch v {
	case r:
		hp = math.Mod((g-b)/c+6, 6)
	case g:
		hp = (b-r)/c + 2
	default:
		hp = (r-g)/c + 4
	}
	deg := math.Mod(60*hp+360*f+720, 360)
	s := c / v
	fn := func(n float64) float64 {
		k := math.Mod(n+deg/60, 6)
		return v - v*s*max(0, min(k, 4-k, 1))
	}
	return fn(5), fn(3), fn(1)
}

// hueTestPixels are random pixels and the awkward ones: grays, ties of
// the largest channel, primaries and secondaries, 0 and 1.
func hueTestPixels(n int) (r, g, b []float32) {
	edge := [][3]float32{{0, 0, 0}, {1, 1, 1}, {0.5, 0.5, 0.5}, {0.8, 0.8, 0.1}, {0.1, 0.7, 0.7}, {0.9, 0.3, 0.9},
		{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0}, {0, 1, 1}, {1, 0, 1}, {0.6, 0.6, 0.59999}, {1, 0.5, 0}}
	rnd := randomImage(7, 3*n)
	for _, p := range edge {
		r, g, b = append(r, p[0]), append(g, p[1]), append(b, p[2])
	}
	for i := range n {
		r, g, b = append(r, float32(rnd[i])/255), append(g, float32(rnd[n+i])/255), append(b, float32(rnd[2*n+i])/255)
	}
	return r, g, b
}

// TestAdjustHueDefinition: AdjustHue agrees with the definition-level
// rotation to 2e-6 (its float32 arithmetic: values in [0, 1], each
// operation rounding by at most 2^-24 relative, about a dozen of them on
// the longest path, ≈ 1e-6; a low-chroma pixel's hue is imprecise, but
// its effect on R, G, B is scaled by the chroma, so the bound holds
// there too); a gray keeps its values exactly; a third of a turn moves
// red to green, (r, g, b) → (b, r, g); the largest and smallest channel
// values are kept (V and V·(1 − S)).
func TestAdjustHueDefinition(t *testing.T) {
	for _, f := range []float64{-0.5, -0.37, -0.1, -1e-3, 0, 1e-6, 0.05, 0.25, 1.0 / 3, 0.49, 0.5} {
		r, g, b := hueTestPixels(200)
		r0, g0, b0 := slices.Clone(r), slices.Clone(g), slices.Clone(b)
		AdjustHue(r, g, b, float32(f))
		for i := range r {
			wr, wg, wb := refHue(float64(r0[i]), float64(g0[i]), float64(b0[i]), float64(float32(f)))
			if d := max(math.Abs(float64(r[i])-wr), math.Abs(float64(g[i])-wg), math.Abs(float64(b[i])-wb)); d > 2e-6 {
				t.Fatalf("factor %v pixel %d (%v, %v, %v): got (%v, %v, %v), want (%v, %v, %v)", f, i, r0[i], g0[i], b0[i], r[i], g[i], b[i], wr, wg, wb)
			}
			if r0[i] == g0[i] && g0[i] == b0[i] && (r[i] != r0[i] || g[i] != r0[i] || b[i] != r0[i]) {
				t.Fatalf("factor %v: gray %v became (%v, %v, %v)", f, r0[i], r[i], g[i], b[i])
			}
			if d := math.Abs(float64(max(r[i], g[i], b[i]) - max(r0[i], g0[i], b0[i]))); d != 0 {
				t.Fatalf("factor %v pixel %d: the largest channel moved by %v", f, i, d)
			}
			if d := math.Abs(float64(min(r[i], g[i], b[i]) - min(r0[i], g0[i], b0[i]))); d > 2e-6 {
				t.Fatalf("factor %v pixel %d: the smallest channel moved by %v", f, i, d)
			}
			if f == 1.0/3 {
				if d := max(math.Abs(float64(r[i]-b0[i])), math.Abs(float64(g[i]-r0[i])), math.Abs(float64(b[i]-g0[i]))); d > 2e-6 {
					t.Fatalf("a third of a turn: (%v, %v, %v) → (%v, %v, %v), want (b, r, g)", r0[i], g0[i], b0[i], r[i], g[i], b[i])
				}
			}
		}
	}
}

// hueFixture is data/testdata/adjust_hue.json, written by
// scripts/hue_fixture.py.
type hueFixture struct {
	Torchvision string               `json:"torchvision"`
	Shape       [3]int               `json:"shape"`
	Images      map[string][]float64 `json:"images"`
	Cases       []struct {
		Image  string    `json:"image"`
		Factor float64   `json:"factor"`
		Output []float64 `json:"output"`
	} `json:"cases"`
}

// TestAdjustHueTorchvision compares AdjustHue with torchvision's
// adjust_hue (float32 tensors, scripts/hue_fixture.py) on random, byte
// and edge-case images for fixed factors from −0.5 to 0.5. Both compute
// in float32 by the same operations, so they should agree to the last
// bit or nearly; the tolerance, 1e-6 (8 float32 ulps at 1), allows for a
// different rounding of the division or of floor near a sector boundary
// (where the result is continuous), and is far below what a wrong
// sector, sign or wrap would give (≥ 1e-3 on these images).
func TestAdjustHueTorchvision(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "adjust_hue.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx hueFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if fx.Shape[0] != 3 || len(fx.Cases) == 0 {
		t.Fatalf("fixture shape %v with %d cases", fx.Shape, len(fx.Cases))
	}
	plane := fx.Shape[1] * fx.Shape[2]
	var worst float64
	for _, c := range fx.Cases {
		in, ok := fx.Images[c.Image]
		if !ok || len(in) != 3*plane || len(c.Output) != 3*plane {
			t.Fatalf("case %s %v: %d inputs, %d outputs for %v", c.Image, c.Factor, len(in), len(c.Output), fx.Shape)
		}
		x := make([]float32, len(in))
		for i, v := range in {
			x[i] = float32(v)
		}
		AdjustHue(x[:plane], x[plane:2*plane], x[2*plane:], float32(c.Factor))
		for i, v := range x {
			d := math.Abs(float64(v) - c.Output[i])
			worst = max(worst, d)
			if d > 1e-6 {
				t.Errorf("image %s factor %v value %d (of %v, %v, %v): got %v, torchvision %v", c.Image, c.Factor, i,
					in[i%plane], in[plane+i%plane], in[2*plane+i%plane], v, c.Output[i])
			}
		}
	}
	t.Logf("%d cases against torchvision %s: largest difference %g", len(fx.Cases), fx.Torchvision, worst)
}

// TestColorJitterHueDraws: with Hue on, the hue factor lies in [−Hue,
// Hue] and the order is a permutation, every one of the 24 drawn about
// equally often; brightness, contrast and saturation draw the same
// factors with Hue on or off; with Hue off the order is the fixed
// brightness, contrast, saturation and the hue factor 0.
func TestColorJitterHueDraws(t *testing.T) {
	on := ColorJitter{Brightness: 0.4, Contrast: 0.4, Saturation: 0.4, Hue: 0.1, Seed: 5}
	off := on
	off.Hue = 0
	counts := map[[4]int]int{}
	var lo, hi float64
	const n = 2400
	for idx := range n {
		p, q := on.Params(1, idx), off.Params(1, idx)
		if p.Brightness != q.Brightness || p.Contrast != q.Contrast || p.Saturation != q.Saturation {
			t.Fatalf("index %d: hue changes the other factors: %+v vs %+v", idx, p, q)
		}
		if q.Hue != 0 || q.Order != [4]int{JitterBrightness, JitterContrast, JitterSaturation, JitterHue} {
			t.Fatalf("index %d: without hue the draw is %+v", idx, q)
		}
		if p.Hue < -0.1 || p.Hue > 0.1 {
			t.Fatalf("index %d: hue factor %v outside [−0.1, 0.1]", idx, p.Hue)
		}
		lo, hi = min(lo, p.Hue), max(hi, p.Hue)
		if s := slices.Sorted(slices.Values(p.Order[:])); !slices.Equal(s, []int{0, 1, 2, 3}) {
			t.Fatalf("index %d: order %v is not a permutation", idx, p.Order)
		}
		if r := on.Params(1, idx); r != p {
			t.Fatalf("index %d: two draws differ", idx)
		}
		counts[p.Order]++
	}
	if lo > -0.09 || hi < 0.09 {
		t.Errorf("hue factors span [%v, %v] over %d draws, want nearly [−0.1, 0.1]", lo, hi, n)
	}
	if len(counts) != 24 {
		t.Errorf("%d distinct orders over %d draws, want 24", len(counts), n)
	}
	for o, c := range counts {
		if c < 50 || c > 150 { // expected 100, sd ≈ 10
			t.Errorf("order %v drawn %d times in %d, want about 100", o, c, n)
		}
	}
	if !(&ColorJitter{Hue: 0.2}).Enabled() {
		t.Error("hue alone is not enabled")
	}
}

// refJitter applies p's operations in p.Order to pix (ch planes of
// plane pixels) from their definitions, in float64; hue is on or off.
func refJitter(pix []uint8, ch, plane int, p JitterParams, hue bool) []float64 {
	x := make([]float64, len(pix))
	for i, v := range pix {
		x[i] = float64(v) / 255
	}
	clamp := func(v float64) float64 { return min(max(v, 0), 1) }
	gray := func(i int) float64 {
		if ch == 1 {
			return x[i]
		}
		return 0.299*x[i] + 0.587*x[plane+i] + 0.114*x[2*plane+i]
	}
	for _, op := range p.Order {
		switch op {
		case JitterBrightness:
			for i := range x {
				x[i] = clamp(x[i] * p.Brightness)
			}
		case JitterContrast:
			var m float64
			for i := range plane {
				m += gray(i)
			}
			m /= float64(plane)
			for i := range x {
				x[i] = clamp(p.Contrast*x[i] + (1-p.Contrast)*m)
			}
		case JitterSaturation:
			if ch == 3 {
				for i := range plane {
					g := gray(i)
					for c := range 3 {
						x[c*plane+i] = clamp(p.Saturation*x[c*plane+i] + (1-p.Saturation)*g)
					}
				}
			}
		case JitterHue:
			if ch == 3 && hue {
				for i := range plane {
					x[i], x[plane+i], x[2*plane+i] = refHue(x[i], x[plane+i], x[2*plane+i], p.Hue)
				}
			}
		}
	}
	return x
}

// TestColorJitterHueApply: Apply with hue is the four operations from
// their definitions in the drawn order (to 1e-5: float32 against float64
// over four operations, the contrast mean among them); hue alone keeps
// grayscale images as they are (p/255), as torchvision's adjust_hue does
// one-channel images, and changes colour ones.
func TestColorJitterHueApply(t *testing.T) {
	const h, w = 4, 5
	plane := h * w
	for _, j := range []ColorJitter{
		{Hue: 0.5, Seed: 2},
		{Brightness: 0.5, Contrast: 0.5, Saturation: 0.5, Hue: 0.3, Seed: 3},
		{Brightness: 0.2, Saturation: 2, Hue: 0.05, Seed: 4},
	} {
		for _, ch := range []int{1, 3} {
			for idx := range 40 {
				pix := randomImage(uint64(idx), ch*plane)
				got := make([]float32, len(pix))
				j.Apply(got, pix, ch, h, w, 2, idx)
				p := j.Params(2, idx)
				want := refJitter(pix, ch, plane, p, true)
				for i := range got {
					if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5 {
						t.Fatalf("%+v ch %d index %d (draw %+v): value %d = %v, want %v", j, ch, idx, p, i, got[i], want[i])
					}
				}
				if j.Brightness == 0 && j.Contrast == 0 && j.Saturation == 0 {
					same := true
					for i, v := range pix {
						same = same && got[i] == float32(v)/255
					}
					if same != (ch == 1) {
						t.Fatalf("hue alone on %d channels: unchanged = %v", ch, same)
					}
				}
			}
		}
	}
}
