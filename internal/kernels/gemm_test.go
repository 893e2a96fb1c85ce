package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// naiveGemm is the reference: c = alpha·op(a)·op(b) + beta·c with float64
// accumulation, beta == 0 overwriting c.
func naiveGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(av) * float64(bv)
			}
			r := float64(alpha) * s
			if beta != 0 {
				r += float64(beta) * float64(c[i*ldc+j])
			}
			c[i*ldc+j] = float32(r)
		}
	}
}

// backends lists the backends available here; openblas is skipped (with a
// log line) where the library does not load.
func backends(t testing.TB) []string {
	names := []string{"gonum"}
	if _, err := loadOpenBLAS(); err == nil {
		names = append(names, "openblas")
	} else {
		t.Logf("openblas backend not tested: %v", err)
	}
	return names
}

// withBackend runs f with the named backend selected, restoring the
// previous one afterwards.
func withBackend(t testing.TB, name string, f func()) {
	prev := Backend()
	if err := SetBackend(name); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := SetBackend(prev); err != nil {
			t.Fatal(err)
		}
	}()
	f()
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func TestGemmMatchesNaive(t *testing.T) {
	sizes := []int{1, 2, 3, 7, 17, 64, 65}
	if testing.Short() {
		sizes = []int{1, 2, 3, 17, 65}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			for _, m := range sizes {
				for _, n := range sizes {
					for _, k := range sizes {
						for tc := range 4 {
							transA, transB := tc&1 != 0, tc&2 != 0
							pad := (m + n + k + tc) % 3 // 0, 1 or 2 extra columns
							checkGemm(t, r, be, transA, transB, m, n, k, pad)
						}
					}
				}
			}
		})
	}
}

// checkGemm compares one product against naiveGemm, with pad extra
// columns in every leading dimension, alpha/beta not 1, and sentinels in the
// padding that must stay untouched.
func checkGemm(t *testing.T, r *rand.Rand, be string, transA, transB bool, m, n, k, pad int) {
	t.Helper()
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	lda, ldb, ldc := ac+pad, bc+pad, n+pad
	a := randSlice(r, ar*lda)
	b := randSlice(r, br*ldb)
	c := randSlice(r, m*ldc)
	const sentinel = -12345
	for i := range m {
		for j := n; j < ldc; j++ {
			c[i*ldc+j] = sentinel
		}
	}
	want := append([]float32(nil), c...)
	alpha, beta := float32(0.7), float32(-1.3)
	naiveGemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
	Gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	for i := range m {
		for j := range ldc {
			got, w := c[i*ldc+j], want[i*ldc+j]
			if j >= n {
				if got != sentinel {
					t.Fatalf("%s tA=%v tB=%v m=%d n=%d k=%d pad=%d: wrote c[%d,%d] outside the matrix", be, transA, transB, m, n, k, pad, i, j)
				}
				continue
			}
			// float32 accumulation error grows with √k·|terms|.
			tol := 1e-5 * (1 + math.Sqrt(float64(k))) * 4
			if d := math.Abs(float64(got - w)); d > tol*(1+math.Abs(float64(w))) {
				t.Fatalf("%s tA=%v tB=%v m=%d n=%d k=%d pad=%d: c[%d,%d]=%v, want %v", be, transA, transB, m, n, k, pad, i, j, got, w)
			}
		}
	}
}

func TestGemmBetaZeroIgnoresNaN(t *testing.T) {
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			a := []float32{1, 2, 3, 4}
			b := []float32{1, 0, 0, 1}
			c := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.NaN()), 5}
			Gemm(false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2)
			for i, w := range []float32{1, 2, 3, 4} {
				if c[i] != w {
					t.Fatalf("%s: c=%v, want [1 2 3 4]", be, c)
				}
			}
		})
	}
}

func TestGemmDegenerate(t *testing.T) {
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			// k == 0: c = beta·c.
			c := []float32{1, 2, 3, 4}
			Gemm(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 2, c, 2)
			if fmt.Sprint(c) != "[2 4 6 8]" {
				t.Errorf("%s k=0: c=%v", be, c)
			}
			// alpha == 0 with beta == 0 zeroes c.
			Gemm(false, false, 2, 2, 2, 0, []float32{1, 1, 1, 1}, 2, []float32{1, 1, 1, 1}, 2, 0, c, 2)
			if fmt.Sprint(c) != "[0 0 0 0]" {
				t.Errorf("%s alpha=0: c=%v", be, c)
			}
			// m == 0 or n == 0: nothing happens, nil slices allowed.
			Gemm(true, true, 0, 3, 4, 1, nil, 1, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4, 0, nil, 3)
			Gemm(false, false, 3, 0, 4, 1, make([]float32, 12), 4, nil, 1, 0, nil, 1)
		})
	}
}

func TestGemmPanicsOnBadShapes(t *testing.T) {
	cases := []struct {
		name string
		f    func()
	}{
		{"short a", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float32, 3), 2, make([]float32, 4), 2, 0, make([]float32, 4), 2)
		}},
		{"short b transposed", func() {
			Gemm(false, true, 2, 3, 2, 1, make([]float32, 4), 2, make([]float32, 5), 2, 0, make([]float32, 6), 3)
		}},
		{"short c", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float32, 4), 2, make([]float32, 4), 2, 0, make([]float32, 4), 3)
		}},
		{"small lda", func() {
			Gemm(true, false, 2, 2, 3, 1, make([]float32, 6), 1, make([]float32, 6), 2, 0, make([]float32, 4), 2)
		}},
		{"negative", func() { Gemm(false, false, -1, 2, 2, 1, nil, 2, nil, 2, 0, nil, 2) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if s, ok := r.(string); !ok || !strings.HasPrefix(s, "kernels: ") {
					t.Fatalf("recovered %v, want a panic starting with \"kernels: \"", r)
				}
			}()
			tc.f()
		})
	}
}

func TestSetBackend(t *testing.T) {
	prev := Backend()
	defer SetBackend(prev)
	if err := SetBackend("gonum"); err != nil || Backend() != "gonum" {
		t.Fatalf("SetBackend(gonum) = %v, Backend() = %q", err, Backend())
	}
	if err := SetBackend("mkl"); err == nil || !strings.Contains(err.Error(), "auto, openblas or gonum") {
		t.Fatalf("SetBackend(mkl) = %v, want an error listing the choices", err)
	}
	if Backend() != "gonum" {
		t.Fatalf("failed SetBackend changed the backend to %q", Backend())
	}
	if err := SetBackend("auto"); err != nil {
		t.Fatal(err)
	}
	_, obErr := loadOpenBLAS()
	if want := map[bool]string{true: "openblas", false: "gonum"}[obErr == nil]; Backend() != want {
		t.Fatalf("auto chose %q, want %q (load error %v)", Backend(), want, obErr)
	}
	if err := SetBackend("openblas"); (err == nil) != (obErr == nil) {
		t.Fatalf("SetBackend(openblas) = %v, load error %v", err, obErr)
	}
}

// TestGemmConcurrent runs products from several goroutines at once (for
// the race detector and OpenBLAS's thread safety).
func TestGemmConcurrent(t *testing.T) {
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			const m, n, k = 33, 17, 65
			r := rand.New(rand.NewPCG(3, 4))
			a, b := randSlice(r, m*k), randSlice(r, k*n)
			want := make([]float32, m*n)
			naiveGemm(false, false, m, n, k, 1, a, k, b, n, 0, want, n)
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					c := make([]float32, m*n)
					for range 20 {
						Gemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
						for i := range c {
							if math.Abs(float64(c[i]-want[i])) > 1e-4*(1+math.Abs(float64(want[i]))) {
								errs <- fmt.Errorf("%s: c[%d]=%v, want %v", be, i, c[i], want[i])
								return
							}
						}
					}
					errs <- nil
				}()
			}
			for range 4 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func BenchmarkGemm(b *testing.B) {
	shapes := []struct {
		name    string
		tA, tB  bool
		m, n, k int
	}{
		{"mlp_fc1_fwd_64x256x784_Bt", false, true, 64, 256, 784},
		{"mlp_fc1_dW_256x784x64_At", true, false, 256, 784, 64},
		{"conv_64x576x800", false, false, 64, 576, 800},
		{"square_256", false, false, 256, 256, 256},
		{"tiny_8", false, false, 8, 8, 8},
	}
	for _, be := range backends(b) {
		for _, s := range shapes {
			b.Run(be+"/"+s.name, func(b *testing.B) {
				withBackend(b, be, func() {
					r := rand.New(rand.NewPCG(5, 6))
					a, bm, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
					lda, ldb := s.k, s.n
					if s.tA {
						lda = s.m
					}
					if s.tB {
						ldb = s.k
					}
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						Gemm(s.tA, s.tB, s.m, s.n, s.k, 1, a, lda, bm, ldb, 0, c, s.n)
					}
					b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			})
		}
	}
}

func TestSetThreads(t *testing.T) {
	defer SetThreads(1)
	for _, n := range []int{2, 0, 1} {
		SetThreads(n)
		if got, want := Threads(), max(n, 1); got != want {
			t.Fatalf("Threads() = %d after SetThreads(%d), want %d", got, n, want)
		}
		for _, be := range backends(t) {
			withBackend(t, be, func() {
				checkGemm(t, rand.New(rand.NewPCG(3, uint64(n))), be, false, true, 65, 130, 70, 0)
			})
		}
	}
}
