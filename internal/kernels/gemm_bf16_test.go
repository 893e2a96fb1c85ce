package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// bf16Case is one GemmBF16 call's inputs.
type bf16Case struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	lda, ldb, ldc  int
	a, b           []BF16
	c              []float32
}

func newBF16Case(r *rand.Rand, transA, transB bool, m, n, k int, alpha, beta float32, pad int) bf16Case {
	t := bf16Case{transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha, beta: beta}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	t.lda, t.ldb, t.ldc = ac+pad, bc+pad, n+pad
	t.a = make([]BF16, ar*t.lda)
	for i := range t.a {
		t.a[i] = ToBF16(float32(r.NormFloat64()))
	}
	t.b = make([]BF16, br*t.ldb)
	for i := range t.b {
		t.b[i] = ToBF16(float32(r.NormFloat64()))
	}
	t.c = make([]float32, m*t.ldc)
	for i := range t.c {
		t.c[i] = float32(r.NormFloat64())
		if beta == 0 {
			t.c[i] = float32(math.NaN()) // beta 0 must not read c
		}
	}
	return t
}

// ops returns op(a) as rows (m×k) and op(b) as columns (n×k), in float64.
func (t bf16Case) ops() (rows, cols []float64) {
	rows, cols = make([]float64, t.m*t.k), make([]float64, t.n*t.k)
	for p := range t.k {
		for i := range t.m {
			ia := i*t.lda + p
			if t.transA {
				ia = p*t.lda + i
			}
			v := t.a[ia]
			rows[i*t.k+p] = float64(v.Float32())
		}
		for j := range t.n {
			ib := p*t.ldb + j
			if t.transB {
				ib = j*t.ldb + p
			}
			v := t.b[ib]
			cols[j*t.k+p] = float64(v.Float32())
		}
	}
	return rows, cols
}

// check runs GemmBF16 on a copy of c and compares every element with the
// product in float64 (exact: bf16 products have 16 bits) within the bound
// GemmBF16 documents; the padding between rows must stay untouched.
func (t bf16Case) check(tb testing.TB) {
	tb.Helper()
	c := append([]float32(nil), t.c...)
	GemmBF16(t.transA, t.transB, t.m, t.n, t.k, t.alpha, t.a, t.lda, t.b, t.ldb, t.beta, c, t.ldc)
	rows, cols := t.ops()
	for i := range t.m {
		for j := range t.ldc {
			got := c[i*t.ldc+j]
			if j >= t.n {
				if math.Float32bits(got) != math.Float32bits(t.c[i*t.ldc+j]) {
					tb.Fatalf("%s: padding c[%d][%d] changed", t, i, j)
				}
				continue
			}
			var sum, mag float64
			for p, x := range rows[i*t.k : (i+1)*t.k] {
				x *= cols[j*t.k+p]
				sum += x
				mag += math.Abs(x)
			}
			want := float64(t.alpha) * sum
			mag *= math.Abs(float64(t.alpha))
			if t.beta != 0 {
				want += float64(t.beta) * float64(t.c[i*t.ldc+j])
				mag += math.Abs(float64(t.beta) * float64(t.c[i*t.ldc+j]))
			}
			if tol := float64(t.k+2) * 0x1p-24 * mag; math.IsNaN(float64(got)) || math.Abs(float64(got)-want) > tol {
				tb.Fatalf("%s: c[%d][%d] = %v, want %v ± %g", t, i, j, got, want, tol)
			}
		}
	}
}

func (t bf16Case) String() string {
	return fmt.Sprintf("GemmBF16(%v, %v, m=%d, n=%d, k=%d, alpha=%v, lda=%d, ldb=%d, beta=%v, ldc=%d)",
		t.transA, t.transB, t.m, t.n, t.k, t.alpha, t.lda, t.ldb, t.beta, t.ldc)
}

// bf16Kernels are the kernel choices on this machine.
func bf16Kernels() []struct {
	name   string
	avx512 bool
} {
	ks := []struct {
		name   string
		avx512 bool
	}{{"go", false}}
	if gemmBF16AVX512 {
		ks = append(ks, struct {
			name   string
			avx512 bool
		}{"avx512bf16", true})
	}
	return ks
}

func TestGemmBF16BoundaryShapes(t *testing.T) {
	sizes := []int{1, 2, 15, 16, 17, 31, 33, 64}
	for _, kn := range bf16Kernels() {
		t.Run(kn.name, func(t *testing.T) {
			defer func(v bool) { gemmBF16AVX512 = v }(gemmBF16AVX512)
			gemmBF16AVX512 = kn.avx512
			r := rand.New(rand.NewPCG(7, 8))
			for _, m := range sizes {
				for _, n := range sizes {
					for _, k := range sizes {
						// Vary the transposition, scaling and padding
						// with the shape rather than trying all.
						h := m*7 + n*3 + k
						newBF16Case(r, h%2 == 0, h%3 == 0, m, n, k, []float32{1, -2, 0.5}[h%3], []float32{0, 1, 0.25}[h%3], h%5/3).check(t)
					}
				}
			}
		})
	}
}

func TestGemmBF16Transpositions(t *testing.T) {
	for _, kn := range bf16Kernels() {
		t.Run(kn.name, func(t *testing.T) {
			defer func(v bool) { gemmBF16AVX512 = v }(gemmBF16AVX512)
			gemmBF16AVX512 = kn.avx512
			r := rand.New(rand.NewPCG(9, 10))
			for _, ta := range []bool{false, true} {
				for _, tb := range []bool{false, true} {
					for _, beta := range []float32{0, 1, -0.5} {
						// K across the 256 block edge, odd K-pairs
						newBF16Case(r, ta, tb, 19, 37, 255, 1, beta, 0).check(t)
						newBF16Case(r, ta, tb, 9, 33, 257, 1.5, beta, 3).check(t)
						newBF16Case(r, ta, tb, 16, 64, 513, 1, beta, 1).check(t)
					}
				}
			}
		})
	}
}

// bf16CNNShapes are the GEMMs of the cnn and fedcnn (m = output channels,
// n = output positions of one image or Winograd tiles of a batch,
// k = C·KH·KW) and of their backward passes.
var bf16CNNShapes = [][3]int{
	{32, 676, 9},    // cnn conv1, im2col
	{64, 576, 288},  // cnn conv2, im2col
	{64, 1152, 32},  // cnn conv2, one of the 16 Winograd products (8 images)
	{288, 576, 64},  // cnn conv2 backward: Wᵀ·dy
	{64, 800, 576},  // a 5×5 fedcnn-sized product
	{64, 196, 800},  // fedcnn conv2
	{32, 128, 9216}, // cnn fc1 (batch 32), K over many blocks
}

func TestGemmBF16CNNShapes(t *testing.T) {
	for _, kn := range bf16Kernels() {
		t.Run(kn.name, func(t *testing.T) {
			defer func(v bool) { gemmBF16AVX512 = v }(gemmBF16AVX512)
			gemmBF16AVX512 = kn.avx512
			r := rand.New(rand.NewPCG(11, 12))
			for i, s := range bf16CNNShapes {
				newBF16Case(r, i == 3, false, s[0], s[1], s[2], 1, float32(i%2), 0).check(t)
			}
		})
	}
}

// TestGemmBF16KernelMatchesGo checks the VDPBF16PS kernel against the Go
// code bit for bit: on the shapes above, and on values whose products and
// sums fall around the smallest normal float32 (the flushing), cancel
// exactly (signed zeros) or are subnormal bf16.
func TestGemmBF16KernelMatchesGo(t *testing.T) {
	if !gemmBF16AVX512 {
		t.Skip("no AVX512-BF16 on this CPU")
	}
	r := rand.New(rand.NewPCG(15, 16))
	tiny := func(t *bf16Case) {
		for _, x := range [][]BF16{t.a, t.b} {
			for i := range x {
				v := math.Ldexp(1+r.Float64(), -70+r.IntN(16))
				if r.IntN(2) == 0 {
					v = -v
				}
				x[i] = ToBF16(float32(v))
				switch r.IntN(16) {
				case 0:
					x[i] = BF16(r.Uint32()) & 0x807f // subnormal or zero
				case 1:
					x[i] = 0x8000
				}
			}
		}
		for i := range t.c {
			if r.IntN(4) == 0 {
				t.c[i] = float32(math.Ldexp(r.NormFloat64(), -127))
			}
		}
	}
	var cases []bf16Case
	for _, s := range [][3]int{{1, 1, 1}, {8, 32, 2}, {9, 33, 3}, {17, 31, 255}, {16, 64, 257}, {3, 5, 600}} {
		for _, beta := range []float32{0, 1, -0.75} {
			for _, ta := range []bool{false, true} {
				c := newBF16Case(r, ta, !ta, s[0], s[1], s[2], 1.25, beta, 1)
				cases = append(cases, c)
				c = newBF16Case(r, ta, ta, s[0], s[1], s[2], 1, beta, 0)
				tiny(&c)
				cases = append(cases, c)
			}
		}
	}
	for i, s := range bf16CNNShapes {
		cases = append(cases, newBF16Case(r, i == 3, false, s[0], s[1], s[2], 1, float32(i%2), 0))
	}
	for _, tc := range cases {
		got := append([]float32(nil), tc.c...)
		GemmBF16(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, tc.a, tc.lda, tc.b, tc.ldb, tc.beta, got, tc.ldc)
		want := append([]float32(nil), tc.c...)
		gemmBF16Go(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, tc.a, tc.lda, tc.b, tc.ldb, tc.beta, want, tc.ldc)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: c[%d] = %v (%#08x), the Go code's %v (%#08x)", tc, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}

func TestGemmBF16Degenerate(t *testing.T) {
	c := []float32{1, 2, 3, 4}
	GemmBF16(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0.5, c, 2)
	if c[0] != 0.5 || c[3] != 2 {
		t.Errorf("k = 0 did not scale c by beta: %v", c)
	}
	GemmBF16(false, false, 0, 2, 3, 1, nil, 3, make([]BF16, 6), 2, 0, nil, 2)
	for _, bad := range []func(){
		func() { GemmBF16(false, false, -1, 1, 1, 1, nil, 1, nil, 1, 0, nil, 1) },
		func() { GemmBF16(false, false, 2, 2, 2, 1, make([]BF16, 3), 2, make([]BF16, 4), 2, 0, c, 2) },
		func() { GemmBF16(false, false, 2, 2, 2, 1, make([]BF16, 4), 1, make([]BF16, 4), 2, 0, c, 2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic on a bad shape")
				}
			}()
			bad()
		}()
	}
}

// BenchmarkGemmBF16 compares GemmBF16 with the float32 Gemm (the selected
// backend, OpenBLAS where it loads) on the cnn's shapes.
func BenchmarkGemmBF16(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, s := range bf16CNNShapes {
		m, n, k := s[0], s[1], s[2]
		t := newBF16Case(r, false, false, m, n, k, 1, 0, 0)
		af, bf := make([]float32, len(t.a)), make([]float32, len(t.b))
		WidenBF16(af, t.a)
		WidenBF16(bf, t.b)
		c := make([]float32, m*n)
		b.Run(fmt.Sprintf("%dx%dx%d/bf16", m, n, k), func(b *testing.B) {
			b.SetBytes(int64(2 * m * n * k)) // flops, reported as bytes
			for b.Loop() {
				GemmBF16(false, false, m, n, k, 1, t.a, k, t.b, n, 0, c, n)
			}
		})
		b.Run(fmt.Sprintf("%dx%dx%d/fp32-%s", m, n, k, Backend()), func(b *testing.B) {
			b.SetBytes(int64(2 * m * n * k))
			for b.Loop() {
				Gemm(false, false, m, n, k, 1, af, k, bf, n, 0, c, n)
			}
		})
	}
}
