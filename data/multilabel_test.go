package data

import (
	"errors"
	"slices"
	"testing"
)

func multiDigitSource(t *testing.T) *Dataset {
	t.Helper()
	train, _, err := Synthetic(200, 1, 11)
	if err != nil {
		t.Fatal(err)
	}
	return train
}

func TestMultiDigitBatch(t *testing.T) {
	src := multiDigitSource(t)
	m, err := MultiDigit(src, 500, 5)
	if err != nil {
		t.Fatal(err)
	}
	if m.N != 500 || m.Len() != 500 || m.C != 1 || m.H != 28 || m.W != 56 || m.Classes != 10 || m.ImageSize() != 28*56 {
		t.Fatalf("shape N=%d C=%d H=%d W=%d classes=%d", m.N, m.C, m.H, m.W, m.Classes)
	}
	idx := []int{499, 0, 17, 17, 250}
	x := make([]float32, len(idx)*m.ImageSize())
	y := make([]float32, len(idx)*m.Classes)
	for i := range y {
		y[i] = 7 // overwritten
	}
	m.Batch(idx, x, y)
	for j, i := range idx {
		a, b := m.Pairs[i][0], m.Pairs[i][1]
		img := x[j*m.ImageSize() : (j+1)*m.ImageSize()]
		for r := range 28 {
			if !slices.Equal(img[r*56:r*56+28], src.Image(a)[r*28:(r+1)*28]) ||
				!slices.Equal(img[r*56+28:(r+1)*56], src.Image(b)[r*28:(r+1)*28]) {
				t.Fatalf("example %d row %d is not source %d | source %d", i, r, a, b)
			}
		}
		la, lb := m.Labels(i)
		if la != src.Labels[a] || lb != src.Labels[b] {
			t.Fatalf("Labels(%d) = %d, %d, want %d, %d", i, la, lb, src.Labels[a], src.Labels[b])
		}
		var want [10]float32
		want[la], want[lb] = 1, 1
		if got := y[j*10 : (j+1)*10]; !slices.Equal(got, want[:]) {
			t.Fatalf("example %d (labels %d, %d): target %v", i, la, lb, got)
		}
	}
}

func TestMultiDigitPairs(t *testing.T) {
	src := multiDigitSource(t)
	m, _ := MultiDigit(src, 4000, 1)
	again, _ := MultiDigit(src, 4000, 1)
	other, _ := MultiDigit(src, 4000, 2)
	if !slices.Equal(m.Pairs, again.Pairs) {
		t.Fatal("same seed, different pairs")
	}
	same, single := 0, 0
	for i := range m.Pairs {
		if m.Pairs[i] == other.Pairs[i] {
			same++
		}
		if a, b := m.Labels(i); a == b {
			single++
		}
	}
	if same > 10 {
		t.Errorf("seeds 1 and 2 share %d of 4000 pairs", same)
	}
	// Balanced synthetic labels: P(same label) = 1/10, 400 ± 4σ (σ ≈ 19).
	if single < 324 || single > 476 {
		t.Errorf("%d of 4000 examples have a single label, want ≈ 400", single)
	}
	counts := m.PositiveCounts()
	total := 0
	for _, c := range counts {
		total += c
	}
	if total != 2*4000-single {
		t.Errorf("PositiveCounts %v sum to %d, want %d", counts, total, 2*4000-single)
	}
	// A single-label example has exactly one 1 in its target.
	for i := range m.Pairs {
		if a, b := m.Labels(i); a == b {
			y := make([]float32, 10)
			m.Batch([]int{i}, make([]float32, m.ImageSize()), y)
			n := 0
			for _, v := range y {
				n += int(v)
			}
			if n != 1 || y[a] != 1 {
				t.Fatalf("example %d with labels %d, %d: target %v", i, a, b, y)
			}
			break
		}
	}
}

func TestMultiDigitErrors(t *testing.T) {
	src := multiDigitSource(t)
	if _, err := MultiDigit(nil, 1, 0); err == nil {
		t.Error("nil source: no error")
	}
	if _, err := MultiDigit(&Dataset{}, 1, 0); err == nil {
		t.Error("empty source: no error")
	}
	if _, err := MultiDigit(src, -1, 0); err == nil {
		t.Error("n = -1: no error")
	}
	m, err := MultiDigit(src, 0, 0)
	if err != nil || m.Len() != 0 {
		t.Fatalf("n = 0: %v, %v", m, err)
	}
}

func TestMultiDigitBatchPanicsAndAllocs(t *testing.T) {
	src := multiDigitSource(t)
	m, _ := MultiDigit(src, 10, 0)
	x, y := make([]float32, 2*m.ImageSize()), make([]float32, 2*m.Classes)
	idx := []int{3, 9}
	if n := testing.AllocsPerRun(10, func() { m.Batch(idx, x, y) }); n != 0 {
		t.Errorf("Batch allocates %v times", n)
	}
	for name, f := range map[string]func(){
		"dstX":  func() { m.Batch(idx, x[1:], y) },
		"dstY":  func() { m.Batch(idx, x, y[1:]) },
		"index": func() { m.Batch([]int{0, 10}, x, y) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if s, _ := recover().(string); len(s) < 6 || s[:6] != "data: " {
					t.Fatalf("recovered %q, want a panic starting with \"data: \"", s)
				}
			}()
			f()
		})
	}
}

// TestMultiDigitRealMNIST builds the task from MNIST's test split where this
// machine has MNIST: 1×28×56 images whose black pixels stay black.
func TestMultiDigitRealMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes 55 MB")
	}
	_, test, err := Load(t.Context(), LoadOptions{Name: MNIST})
	if errors.Is(err, ErrNotFound) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := MultiDigit(test, 100, 3)
	if err != nil {
		t.Fatal(err)
	}
	if m.C != 1 || m.H != 28 || m.W != 56 {
		t.Fatalf("MNIST pairs are %d×%d×%d, want 1×28×56", m.C, m.H, m.W)
	}
	x, y := make([]float32, m.ImageSize()), make([]float32, m.Classes)
	m.Batch([]int{42}, x, y)
	// MNIST's corners are black in every image.
	black := test.Image(0)[0]
	if x[0] != black || x[27] != black || x[28] != black || x[55] != black {
		t.Fatalf("top-row corners %v %v %v %v, want the black value %v", x[0], x[27], x[28], x[55], black)
	}
	if z := test.ZeroPixel(); z-black > 1e-5 || black-z > 1e-5 {
		t.Fatalf("ZeroPixel %v, stored black %v", z, black)
	}
}
