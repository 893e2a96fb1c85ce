package data

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"testing"
)

func TestColorSetDeterministic(t *testing.T) {
	c1, f1, p1 := ColorSet(30, 5, false)
	c2, f2, p2 := ColorSet(30, 5, false)
	if string(c1) != string(c2) || string(f1) != string(f2) || string(p1) != string(p2) {
		t.Fatal("ColorSet is not deterministic")
	}
	_, _, pt := ColorSet(30, 5, true)
	if string(pt) == string(p1) {
		t.Error("train and test draw the same images")
	}
	for i := range f1 {
		if c1[i] != f1[i]/5 || f1[i] >= 100 {
			t.Fatalf("example %d: coarse %d, fine %d", i, c1[i], f1[i])
		}
	}
	if runtime.GOARCH == "amd64" {
		// Pinned so that a change to the generator is deliberate: tests
		// and experiments may depend on these bytes.
		h := sha256.Sum256(p1)
		const want = "4318350d17dcee6f30d2e8ae11164d608669ef008625cb4c0ad000f7d9ee4e95"
		if got := hex.EncodeToString(h[:]); got != want {
			t.Errorf("ColorSet(30, 5) pixels hash %s, pinned %s", got, want)
		}
	}
}

// TestColorSetLearnable checks that the set carries its labels: a nearest
// class-mean classifier over the 100 fine classes, on 8×8-block means of
// the raw pixels (far weaker than a CNN), is well above chance on held-out
// data, for fine labels and for the coarse ones its answers imply. The set
// goes through the CIFAR-100 files, so the writer and reader are
// exercised too.
func TestColorSetLearnable(t *testing.T) {
	dir := t.TempDir()
	if err := WriteColorSet(dir, 3000, 400, 1); err != nil {
		t.Fatal(err)
	}
	train, test, err := OpenCIFAR100(dir, Fine)
	if err != nil {
		t.Fatal(err)
	}
	defer train.Close()
	defer test.Close()
	ctrain, ctest, err := OpenCIFAR100(dir, Coarse)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrain.Close()
	defer ctest.Close()
	if train.Info().N != 3000 || test.Info().N != 400 || train.Info().ClassNames[1] != "hue000-disc" || ctrain.Info().Classes != 20 {
		t.Fatalf("info %+v / %+v", train.Info(), test.Info())
	}
	feat := func(pix []uint8) []float64 {
		f := make([]float64, 3*16)
		for c := range 3 {
			for y := range 32 {
				for x := range 32 {
					f[c*16+(y/8)*4+x/8] += float64(pix[c*1024+y*32+x])
				}
			}
		}
		return f
	}
	const k = 100
	means := make([][]float64, k)
	counts := make([]int, k)
	for i := range means {
		means[i] = make([]float64, 48)
	}
	for i := range 3000 {
		l := train.Label(i)
		for j, v := range feat(readAll(t, train, i)) {
			means[l][j] += v
		}
		counts[l]++
	}
	for l := range means {
		for j := range means[l] {
			means[l][j] /= float64(max(counts[l], 1))
		}
	}
	fine, coarse := 0, 0
	for i := range 400 {
		f := feat(readAll(t, test, i))
		best, bestD := -1, 0.0
		for l := range means {
			var d float64
			for j := range f {
				d += (f[j] - means[l][j]) * (f[j] - means[l][j])
			}
			if best < 0 || d < bestD {
				best, bestD = l, d
			}
		}
		if int32(best) == test.Label(i) {
			fine++
		}
		if int32(best/5) == ctest.Label(i) {
			coarse++
		}
	}
	t.Logf("nearest class mean: fine %.1f %% (chance 1 %%), coarse %.1f %% (chance 5 %%)", float64(fine)/4, float64(coarse)/4)
	// The set is fixed by its seed, so these are exact outcomes with a
	// margin below them (126 and 220 when written), far above chance.
	if fine < 100 || coarse < 180 {
		t.Errorf("nearest class mean: %d fine and %d coarse right of 400, want ≥ 100 (25 %%) and ≥ 180 (45 %%)", fine, coarse)
	}
	st, err := ChannelStats(context.Background(), train, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Materialize(context.Background(), train, []float64{st.OverallMean}, []float64{st.OverallStd}, 0); err != nil {
		t.Fatal(err)
	}
}
