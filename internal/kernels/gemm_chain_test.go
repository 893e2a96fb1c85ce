package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestGemmChain checks GemmChain against a float64 product on boundary
// sizes (rows not a multiple of 4, columns around 16 and 32, one inner
// step), with A row-major and transposed, set and accumulated, on the
// vector and Go paths; and that its values do not depend on how the rows
// and columns are cut into calls (the property the convolutions rely on),
// bit for bit.
func TestGemmChain(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 21))
	for _, simd := range []bool{false, true} {
		if simd && !chainSIMD {
			continue
		}
		func() {
			defer func(v bool) { chainSIMD = v }(chainSIMD)
			chainSIMD = simd
			for _, m := range []int{1, 3, 4, 5, 8, 17} {
				for _, n := range []int{1, 15, 16, 17, 31, 32, 33, 64, 100, 196} {
					for _, k := range []int{1, 3, 16, 17, 64} {
						for _, trans := range []bool{false, true} {
							for _, acc := range []bool{false, true} {
								name := fmt.Sprintf("simd %v m %d n %d k %d trans %v acc %v", simd, m, n, k, trans, acc)
								checkChain(t, r, name, m, n, k, trans, acc)
							}
						}
					}
				}
			}
		}()
	}
}

func checkChain(t *testing.T, r *rand.Rand, name string, m, n, k int, trans, acc bool) {
	t.Helper()
	a := randSlice(r, m*k)
	rsA, csA := k, 1
	if trans { // a holds Aᵀ, (k, m)
		rsA, csA = 1, m
	}
	ldb, ldc := n+3, n+5
	b := randSlice(r, k*ldb)
	c0 := randSlice(r, m*ldc)
	c := slices.Clone(c0)
	GemmChain(m, n, k, a, rsA, csA, b, ldb, acc, c, ldc)
	for i := range m {
		for j := range ldc {
			got := c[i*ldc+j]
			if j >= n {
				if got != c0[i*ldc+j] {
					t.Fatalf("%s: C[%d,%d] past n written", name, i, j)
				}
				continue
			}
			var s, abs float64
			for p := range k {
				v := float64(a[i*rsA+p*csA]) * float64(b[p*ldb+j])
				s += v
				abs += math.Abs(v)
			}
			if acc {
				s += float64(c0[i*ldc+j])
				abs += math.Abs(float64(c0[i*ldc+j]))
			}
			if d := math.Abs(float64(got) - s); d > 1e-6*(abs+1) {
				t.Fatalf("%s: C[%d,%d] = %v, want %v", name, i, j, got, s)
			}
		}
	}
	// the same values row by row and in column pieces
	pieces := slices.Clone(c0)
	for i := range m {
		for j0 := 0; j0 < n; {
			w := min(n-j0, 1+r.IntN(40))
			GemmChain(1, w, k, a[i*rsA:], rsA, csA, b[j0:], ldb, acc, pieces[i*ldc+j0:], ldc)
			j0 += w
		}
	}
	if i := sameBits(pieces, c); i >= 0 {
		t.Fatalf("%s: C[%d] = %v row by row in pieces, %v in one call", name, i, pieces[i], c[i])
	}
}

// BenchmarkGemmChain compares GemmChain with Gemm on resnet8's
// Winograd and im2col product shapes (one call each).
func BenchmarkGemmChain(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][3]int{{16, 196, 16}, {32, 294, 32}, {64, 320, 64}, {32, 196, 144}, {144, 196, 32}, {64, 49, 288}} {
		m, n, k := s[0], s[1], s[2]
		a, bb, c := randSlice(r, m*k), randSlice(r, k*n), make([]float32, m*n)
		b.Run(fmt.Sprintf("chain/%dx%dx%d", m, n, k), func(b *testing.B) {
			for b.Loop() {
				GemmChain(m, n, k, a, k, 1, bb, n, false, c, n)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("gemm/%dx%dx%d", m, n, k), func(b *testing.B) {
			for b.Loop() {
				Gemm(false, false, m, n, k, 1, a, k, bb, n, 0, c, n)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
