package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// withBNSIMD runs f on the Go code and, where the CPU has AVX-512, on the
// vector kernels.
func withBNSIMD(t *testing.T, f func(t *testing.T)) {
	saved := bnSIMD
	defer func() { bnSIMD = saved }()
	for _, on := range []bool{false, true} {
		if on && !bnAVX512 {
			t.Log("no AVX-512: vector batch-norm kernels not tested")
			continue
		}
		bnSIMD = on
		name := "go"
		if on {
			name = "avx512"
		}
		t.Run(name, f)
	}
}

var bnLens = []int{0, 1, 3, 15, 16, 17, 31, 32, 33, 64, 100, 1023}

// TestAcc64 checks the float64 lane sums against their definition (the
// lane assignment and reduction tree written out) bit for bit, over
// several slices added in turn, and against a plain float64 total.
func TestAcc64(t *testing.T) {
	withBNSIMD(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 7))
		var a, sq, da, db, na, nb Acc64
		var want, wantSq, wantDa, wantDb, wantNb [16]float64
		var plain float64
		const mu = 0.25
		const mean, inv = 0.1, 1.3
		for _, n := range bnLens {
			x, dy := randSlice(r, n), randSlice(r, n)
			a.AddF32(x)
			sq.AddSqDev(x, mu)
			da.AddDot(&db, dy, x)
			na.AddDotNorm(&nb, dy, x, mean, inv)
			blocks := n &^ 15
			for i, v := range x {
				j := i % 16
				if i >= blocks {
					j = i - blocks
				}
				want[j] += float64(v)
				d := float64(v) - mu
				wantSq[j] += d * d
				wantDa[j] += float64(dy[i])
				wantDb[j] += float64(dy[i]) * float64(v)
				wantNb[j] += float64(dy[i]) * float64(float32(float32(v-mean)*inv))
				plain += float64(v)
			}
		}
		for _, c := range []struct {
			name      string
			got, want *[16]float64
		}{{"sum", (*[16]float64)(&a), &want}, {"sqdev", (*[16]float64)(&sq), &wantSq}, {"dot a", (*[16]float64)(&da), &wantDa}, {"dot b", (*[16]float64)(&db), &wantDb},
			{"dotnorm a", (*[16]float64)(&na), &wantDa}, {"dotnorm b", (*[16]float64)(&nb), &wantNb}} {
			for j := range 16 {
				if math.Float64bits(c.got[j]) != math.Float64bits(c.want[j]) {
					t.Fatalf("%s lane %d = %v, want %v", c.name, j, c.got[j], c.want[j])
				}
			}
		}
		w := Acc64(want)
		s := w.Sum()
		tree := ((want[0] + want[8] + (want[4] + want[12])) + (want[2] + want[10] + (want[6] + want[14]))) +
			((want[1] + want[9] + (want[5] + want[13])) + (want[3] + want[11] + (want[7] + want[15])))
		if math.Float64bits(s) != math.Float64bits(tree) {
			t.Fatalf("Sum = %v, want the tree's %v", s, tree)
		}
		if math.Abs(s-plain) > 1e-12*math.Abs(plain)+1e-12 {
			t.Fatalf("Sum = %v, plain float64 total %v", s, plain)
		}
	})
}

// TestBNElementwise checks BNNormalize and BNInputGrad against their
// formulas, one float32 rounding per operation, bit for bit (Inf and NaN
// inputs included).
func TestBNElementwise(t *testing.T) {
	withBNSIMD(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(4, 8))
		for _, n := range bnLens {
			x, dy, xh := randSlice(r, n), randSlice(r, n), randSlice(r, n)
			if n > 20 {
				x[3], x[17] = float32(math.Inf(1)), float32(math.NaN())
				dy[5] = float32(math.Inf(-1))
			}
			const mean, inv, g, b = 0.3, 1.7, -0.8, 0.05
			gotH, gotY := make([]float32, n), make([]float32, n)
			BNNormalize(gotH, gotY, x, mean, inv, g, b)
			const k, mdy, mdyx = 0.9, -0.02, 0.3
			gotDx := make([]float32, n)
			BNInputGrad(gotDx, dy, xh, k, mdy, mdyx)
			// without a stored x̂: y alone, and dx from x
			gotY2 := make([]float32, n)
			BNNormalize(nil, gotY2, x, mean, inv, g, b)
			gotDx2 := make([]float32, n)
			BNInputGradNorm(gotDx2, dy, x, mean, inv, k, mdy, mdyx)
			for i := range x {
				dx2 := float32(k * float32(float32(dy[i]-mdy)-float32(gotH[i]*mdyx)))
				if math.Float32bits(gotY2[i]) != math.Float32bits(gotY[i]) || math.Float32bits(gotDx2[i]) != math.Float32bits(dx2) {
					t.Fatalf("n %d, i %d: y %v dx %v from x, want %v %v", n, i, gotY2[i], gotDx2[i], gotY[i], dx2)
				}
			}
			for i, v := range x {
				h := float32(float32(v-mean) * inv)
				y := float32(float32(h*g) + b)
				u := float32(dy[i] - mdy)
				dx := float32(k * float32(u-float32(xh[i]*mdyx)))
				if math.Float32bits(gotH[i]) != math.Float32bits(h) || math.Float32bits(gotY[i]) != math.Float32bits(y) || math.Float32bits(gotDx[i]) != math.Float32bits(dx) {
					t.Fatalf("n %d, i %d: xhat %v y %v dx %v, want %v %v %v", n, i, gotH[i], gotY[i], gotDx[i], h, y, dx)
				}
			}
		}
	})
}

func BenchmarkBN(b *testing.B) {
	saved := bnSIMD
	defer func() { bnSIMD = saved }()
	r := rand.New(rand.NewPCG(1, 1))
	const n = 64 * 1024
	x, dy, xh, y := randSlice(r, n), randSlice(r, n), make([]float32, n), make([]float32, n)
	for _, path := range []string{"go", "avx512"} {
		if path == "avx512" && !bnAVX512 {
			continue
		}
		bnSIMD = path == "avx512"
		b.Run(path+"/stats", func(b *testing.B) {
			for b.Loop() {
				var a, s Acc64
				a.AddF32(x)
				s.AddSqDev(x, a.Sum()/n)
			}
		})
		b.Run(path+"/normalize", func(b *testing.B) {
			for b.Loop() {
				BNNormalize(xh, y, x, 0.1, 1.1, 0.9, 0.01)
			}
		})
		b.Run(path+"/backward", func(b *testing.B) {
			for b.Loop() {
				var a, s Acc64
				a.AddDot(&s, dy, xh)
				BNInputGrad(y, dy, xh, 0.9, 0.01, 0.02)
			}
		})
	}
}
