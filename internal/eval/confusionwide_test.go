package eval

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestConfusionWide: int32 labels beyond 255 are counted in their own
// row, and byte and int32 labels count alike.
func TestConfusionWide(t *testing.T) {
	c := NewConfusion(300)
	c.AddPredictionsWide([]int{299, 43, 299}, []int32{299, 299, 43})
	if c.Count(299, 299) != 1 || c.Count(299, 43) != 1 || c.Count(43, 299) != 1 || c.Total() != 3 {
		t.Errorf("counts (299,299)=%d (299,43)=%d (43,299)=%d total %d; want 1 1 1 3",
			c.Count(299, 299), c.Count(299, 43), c.Count(43, 299), c.Total())
	}
	logits := make([]float32, 2*300)
	logits[299] = 1     // sample 0 predicts 299
	logits[300+256] = 1 // sample 1 predicts 256
	c.Reset()
	c.AddWide(logits, []int32{299, 257})
	if c.Correct() != 1 || c.Count(257, 256) != 1 {
		t.Errorf("AddWide: correct %d, (257,256)=%d; want 1, 1", c.Correct(), c.Count(257, 256))
	}
	a, b := NewConfusion(4), NewConfusion(4)
	a.AddPredictions([]int{0, 3, 2}, []uint8{0, 1, 2})
	b.AddPredictionsWide([]int{0, 3, 2}, []int32{0, 1, 2})
	for y := range 4 {
		for p := range 4 {
			if a.Count(y, p) != b.Count(y, p) {
				t.Fatalf("(%d,%d): byte labels %d, int32 %d", y, p, a.Count(y, p), b.Count(y, p))
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a negative label: no panic")
		}
	}()
	c.AddPredictionsWide([]int{0}, []int32{-1})
}

// TestConfusionSparse: above DenseConfusionClasses the matrix is held
// sparse and every figure equals a plain count of the same examples, for
// label spaces just past the dense limit and far beyond it (a dense
// 100,000-class matrix would need 80 GB).
func TestConfusionSparse(t *testing.T) {
	for _, classes := range []int{DenseConfusionClasses, DenseConfusionClasses + 1, 3001, 100_000} {
		rng := rand.New(rand.NewPCG(uint64(classes), 7))
		type pair struct{ t, p int }
		want := map[pair]int64{}
		a, b := NewConfusion(classes), NewConfusion(classes)
		if got := a.sparse(); got != (classes > DenseConfusionClasses) {
			t.Fatalf("%d classes: sparse %v", classes, got)
		}
		for i := range 5000 {
			y := rng.IntN(min(classes, 50)) * (classes / min(classes, 50)) // a few hundred rows
			p := y
			if rng.IntN(3) == 0 {
				p = rng.IntN(classes)
			}
			want[pair{y, p}]++
			dst := a
			if i%2 == 1 {
				dst = b
			}
			dst.AddPredictionsWide([]int{p}, []int32{int32(y)})
		}
		a.Merge(b)
		var total, correct int64
		rows := map[int]int64{}
		diag := map[int]int64{}
		for k, v := range want {
			if got := a.Count(k.t, k.p); got != v {
				t.Fatalf("%d classes: Count(%d, %d) = %d, want %d", classes, k.t, k.p, got, v)
			}
			total += v
			rows[k.t] += v
			if k.t == k.p {
				correct += v
				diag[k.t] += v
			}
		}
		if a.Total() != total || a.Correct() != correct {
			t.Fatalf("%d classes: total %d correct %d, want %d %d", classes, a.Total(), a.Correct(), total, correct)
		}
		if got := a.Count(classes-1, 0); got != want[pair{classes - 1, 0}] {
			t.Fatalf("%d classes: an untouched entry counts %d", classes, got)
		}
		acc := a.ClassAccuracy(nil)
		var sum float64
		for c := range classes {
			n := rows[c]
			if n == 0 {
				if !math.IsNaN(acc[c]) {
					t.Fatalf("%d classes: class %d has no example but accuracy %v", classes, c, acc[c])
				}
				continue
			}
			w := float64(diag[c]) / float64(n)
			if acc[c] != w {
				t.Fatalf("%d classes: class %d accuracy %v, want %v", classes, c, acc[c], w)
			}
			sum += w
		}
		if got, w := a.BalancedAccuracy(), sum/float64(len(rows)); math.Abs(got-w) > 1e-12 {
			t.Fatalf("%d classes: balanced accuracy %v, want %v", classes, got, w)
		}
		a.Reset()
		if a.Total() != 0 || a.Correct() != 0 {
			t.Fatalf("%d classes: after Reset total %d correct %d", classes, a.Total(), a.Correct())
		}
	}
	// Matrix gives the same rows in either form.
	s := NewConfusion(DenseConfusionClasses + 1)
	s.AddPredictionsWide([]int{3, 5, 5}, []int32{3, 3, 1024})
	m := s.Matrix()
	if m[3][3] != 1 || m[3][5] != 1 || m[1024][5] != 1 || len(m) != DenseConfusionClasses+1 {
		t.Fatalf("sparse Matrix: (3,3)=%d (3,5)=%d (1024,5)=%d", m[3][3], m[3][5], m[1024][5])
	}
}
