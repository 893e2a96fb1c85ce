package data

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// ramp returns n distinct values, so that any misplaced pixel shows.
func ramp(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i) + 0.5
	}
	return x
}

// naiveShift is torchvision's RandomCrop written out: pad the (h, w) plane
// by p on every side with fill, then crop h×w at offset (dy+p, dx+p).
func naiveShift(plane []float32, h, w, p, dy, dx int, fill float32) []float32 {
	ph, pw := h+2*p, w+2*p
	padded := make([]float32, ph*pw)
	for i := range padded {
		padded[i] = fill
	}
	for y := range h {
		copy(padded[(y+p)*pw+p:], plane[y*w:(y+1)*w])
	}
	out := make([]float32, h*w)
	for y := range h {
		copy(out[y*w:(y+1)*w], padded[(y+dy+p)*pw+dx+p:])
	}
	return out
}

func TestShiftZeroIsIdentity(t *testing.T) {
	x := ramp(3 * 5 * 7)
	want := slices.Clone(x)
	shift(x[:35], 5, 7, 0, 0, -1)
	if !slices.Equal(x, want) {
		t.Fatal("shift by (0, 0) changed the plane")
	}
	var a Augmenter // zero value: no crop, no flip
	a.Apply(x, 1, 3, 5, 7, []int{0}, 3, -1)
	if !slices.Equal(x, want) {
		t.Fatal("the zero Augmenter changed the batch")
	}
	// Pad > 0 but a draw of (0, 0) without flip is also the identity.
	a = Augmenter{Pad: 2, Seed: 1}
	for idx := range 1000 {
		if dy, dx, _ := a.params(0, idx); dy == 0 && dx == 0 {
			x := ramp(35)
			a.Apply(x, 1, 1, 5, 7, []int{idx}, 0, -1)
			if !slices.Equal(x, ramp(35)) {
				t.Fatalf("index %d drew offset (0, 0) but its image changed", idx)
			}
			return
		}
	}
	t.Fatal("no index in 1000 drew offset (0, 0)")
}

func TestShiftMatchesPadAndCrop(t *testing.T) {
	const h, w, fill = 5, 7, -9
	src := ramp(h * w)
	for _, p := range []int{1, 3, 8} {
		for dy := -p; dy <= p; dy++ {
			for dx := -p; dx <= p; dx++ {
				got := slices.Clone(src)
				shift(got, h, w, dy, dx, fill)
				if want := naiveShift(src, h, w, p, dy, dx, fill); !slices.Equal(got, want) {
					t.Fatalf("pad %d shift (%d, %d):\n got %v\nwant %v", p, dy, dx, got, want)
				}
			}
		}
	}
	// Shifted content equals the source: out(y, x) = in(y+dy, x+dx).
	got := slices.Clone(src)
	shift(got, h, w, 1, -2, fill)
	for y := range h {
		for x := range w {
			sy, sx := y+1, x-2
			want := float32(fill)
			if sy < h && sx >= 0 {
				want = src[sy*w+sx]
			}
			if got[y*w+x] != want {
				t.Fatalf("(%d, %d) = %v, want %v", y, x, got[y*w+x], want)
			}
		}
	}
}

func TestFlipTwiceIsIdentity(t *testing.T) {
	for _, w := range []int{1, 2, 7, 8} {
		x := ramp(3 * w)
		flipRows(x, 3, w)
		if w > 1 && x[0] != float32(w-1)+0.5 {
			t.Fatalf("w=%d: row 0 flipped to %v", w, x[:w])
		}
		flipRows(x, 3, w)
		if !slices.Equal(x, ramp(3*w)) {
			t.Fatalf("w=%d: flip twice = %v", w, x)
		}
	}
}

// TestApplyMatchesReference checks each image of a batch, every channel
// moved alike, against pad-crop-flip done naively with the drawn params.
func TestApplyMatchesReference(t *testing.T) {
	const n, c, h, w, fill = 6, 3, 4, 5, -2
	a := Augmenter{Pad: 2, Flip: true, Seed: 42}
	indices := []int{10, 3, 7, 3, 0, 99}
	x := ramp(n * c * h * w)
	src := slices.Clone(x)
	a.Apply(x, n, c, h, w, indices, 5, fill)
	for j, idx := range indices {
		dy, dx, flip := a.params(5, idx)
		for ch := range c {
			off := (j*c + ch) * h * w
			want := naiveShift(src[off:off+h*w], h, w, a.Pad, dy, dx, fill)
			if flip {
				flipRows(want, h, w)
			}
			if got := x[off : off+h*w]; !slices.Equal(got, want) {
				t.Fatalf("image %d channel %d (shift %d,%d flip %v): got %v, want %v", j, ch, dy, dx, flip, got, want)
			}
		}
	}
}

func TestApplyDeterministic(t *testing.T) {
	train, _, err := Synthetic(64, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	sz := train.ImageSize()
	a := Augmenter{Pad: 3, Flip: true, Seed: 7}
	fill := train.ZeroPixel()
	// Augment 0..63 as one batch, then in batches of 5 in reverse order:
	// each example's result depends on (seed, epoch, index) only.
	all := make([]int, train.N)
	for i := range all {
		all[i] = i
	}
	whole := make([]float32, train.N*sz)
	y := make([]int32, train.N)
	train.Batch(all, whole, y)
	a.Apply(whole, train.N, train.C, train.H, train.W, all, 2, fill)
	rev := slices.Clone(all)
	slices.Reverse(rev)
	for lo := 0; lo < len(rev); lo += 5 {
		idx := rev[lo:min(lo+5, len(rev))]
		part := make([]float32, len(idx)*sz)
		train.Batch(idx, part, y[:len(idx)])
		a.Apply(part, len(idx), train.C, train.H, train.W, idx, 2, fill)
		for j, i := range idx {
			if !slices.Equal(part[j*sz:(j+1)*sz], whole[i*sz:(i+1)*sz]) {
				t.Fatalf("example %d augmented differently in a batch of %d", i, len(idx))
			}
		}
	}
	// Another epoch or seed draws differently for most examples.
	differs := func(b Augmenter, epoch int) int {
		d := 0
		for _, i := range all {
			dy0, dx0, f0 := a.params(2, i)
			dy1, dx1, f1 := b.params(epoch, i)
			if dy0 != dy1 || dx0 != dx1 || f0 != f1 {
				d++
			}
		}
		return d
	}
	if d := differs(a, 3); d < len(all)/2 {
		t.Errorf("epoch 3 vs 2: only %d of %d examples drew other params", d, len(all))
	}
	b := a
	b.Seed++
	if d := differs(b, 2); d < len(all)/2 {
		t.Errorf("seed 8 vs 7: only %d of %d examples drew other params", d, len(all))
	}
}

func TestAugmenterParamsDistribution(t *testing.T) {
	a := Augmenter{Pad: 2, Flip: true, Seed: 1}
	const draws = 20000
	var dys, dxs [5]int
	flips := 0
	for i := range draws {
		dy, dx, f := a.params(i%7, i)
		dys[dy+2]++
		dxs[dx+2]++
		if f {
			flips++
		}
	}
	for k := range 5 {
		// Each offset has probability 1/5: 4000 ± 4σ (σ ≈ 57).
		if math.Abs(float64(dys[k])-draws/5) > 230 || math.Abs(float64(dxs[k])-draws/5) > 230 {
			t.Fatalf("offset counts dy %v dx %v, want ≈ %d each", dys, dxs, draws/5)
		}
	}
	if math.Abs(float64(flips)-draws/2) > 300 { // σ ≈ 71
		t.Fatalf("%d flips in %d draws", flips, draws)
	}
	a.Flip = false
	for i := range 100 {
		if _, _, f := a.params(0, i); f {
			t.Fatal("Flip false but a flip was drawn")
		}
	}
}

func TestZeroPixel(t *testing.T) {
	tr := split{pix: []uint8{0, 51, 102, 153, 204, 255, 0, 255}, labels: []uint8{0, 1}, n: 2, c: 1, h: 2, w: 2}
	train, _, err := newDatasets("t", 2, tr, tr)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := train.ZeroPixel(), train.Images[0]; math.Abs(float64(got-want)) > 1e-6 {
		t.Fatalf("ZeroPixel = %v, standardised black pixel = %v", got, want)
	}
}

func TestApplyAllocs(t *testing.T) {
	a := Augmenter{Pad: 4, Flip: true, Seed: 1}
	x := ramp(8 * 3 * 32 * 32)
	idx := []int{0, 1, 2, 3, 4, 5, 6, 7}
	if n := testing.AllocsPerRun(10, func() { a.Apply(x, 8, 3, 32, 32, idx, 1, 0) }); n != 0 {
		t.Fatalf("Apply allocates %v times", n)
	}
}

func TestApplyPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"len x":   func() { (&Augmenter{Pad: 1}).Apply(make([]float32, 7), 2, 1, 2, 2, []int{0, 1}, 0, 0) },
		"indices": func() { (&Augmenter{Pad: 1}).Apply(make([]float32, 8), 2, 1, 2, 2, []int{0}, 0, 0) },
		"pad":     func() { (&Augmenter{Pad: -1}).Apply(make([]float32, 8), 2, 1, 2, 2, []int{0, 1}, 0, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if s := fmt.Sprint(recover()); len(s) < 6 || s[:6] != "data: " {
					t.Fatalf("recovered %q, want a panic starting with \"data: \"", s)
				}
			}()
			f()
		})
	}
}

func BenchmarkAugmenterApply(b *testing.B) {
	a := Augmenter{Pad: 2, Flip: true, Seed: 1}
	const n, h, w = 64, 28, 28
	x := ramp(n * h * w)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a.Apply(x, n, 1, h, w, idx, i, 0)
	}
}
