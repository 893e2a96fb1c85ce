package kernels

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
)

// fp16Value is binary16 pattern h's value computed from the definition
// (not with FP16.Float32's bit moves); NaN for NaNs.
func fp16Value(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10)&0x1f, float64(h&0x3ff)
	switch {
	case e == 0x1f && m != 0:
		return math.NaN()
	case e == 0x1f:
		return math.Inf(int(s))
	case e == 0:
		return s * math.Ldexp(m, -24)
	}
	return s * math.Ldexp(1+m/1024, e-15)
}

// bf16Value is bfloat16 pattern h's value from the definition.
func bf16Value(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>7)&0xff, float64(h&0x7f)
	switch {
	case e == 0xff && m != 0:
		return math.NaN()
	case e == 0xff:
		return math.Inf(int(s))
	case e == 0:
		return s * math.Ldexp(m, -133)
	}
	return s * math.Ldexp(1+m/128, e-127)
}

// half16 abstracts the two formats for the table-driven tests.
type half16 struct {
	name   string
	value  func(uint16) float64 // from the definition
	widen  func(uint16) float32
	narrow func(float32) uint16
	inf    uint16  // +Inf's pattern
	beyond float64 // 2^(emax+1): where +Inf sits for rounding
}

var halfFormats = []half16{
	{"fp16", fp16Value, func(h uint16) float32 { return FP16(h).Float32() }, func(f float32) uint16 { return uint16(ToFP16(f)) }, 0x7c00, 65536},
	{"bf16", bf16Value, func(h uint16) float32 { return BF16(h).Float32() }, func(f float32) uint16 { return uint16(ToBF16(f)) }, 0x7f80, math.Ldexp(1, 128)},
}

func TestHalfAllPatterns(t *testing.T) {
	for _, f := range halfFormats {
		bad := 0
		for p := range 1 << 16 {
			h := uint16(p)
			v, w := f.value(h), f.widen(h)
			if math.IsNaN(v) {
				if !math.IsNaN(float64(w)) || !math.IsNaN(float64(f.widen(f.narrow(w)))) {
					t.Errorf("%s %#04x: NaN widens to %v, narrows back to %#04x", f.name, h, w, f.narrow(w))
					bad++
				}
			} else if float64(w) != v || math.Signbit(float64(w)) != math.Signbit(v) {
				t.Errorf("%s %#04x: widens to %v, want %v", f.name, h, w, v)
				bad++
			} else if back := f.narrow(w); back != h {
				t.Errorf("%s %#04x: widened %v narrows to %#04x", f.name, h, w, back)
				bad++
			}
			if bad > 10 {
				t.Fatal("too many errors")
			}
		}
	}
}

// naiveRound is the reference narrowing: with vals the values of the
// non-negative finite patterns 0, 1, … in increasing order and then
// f.beyond for +Inf, it finds the neighbours of |x| and picks the nearer
// by exact big.Float distances, the even pattern on a tie.
func naiveRound(f half16, vals []float64, x float32) uint16 {
	var sign uint16
	if math.Signbit(float64(x)) {
		sign = 0x8000
	}
	ax := math.Abs(float64(x))
	i := sort.SearchFloat64s(vals, ax)
	switch {
	case i == len(vals):
		return sign | f.inf
	case vals[i] == ax:
		return sign | uint16(i)
	}
	lo, hi := uint16(i-1), uint16(i)
	dlo := new(big.Float).Sub(big.NewFloat(ax), big.NewFloat(vals[lo]))
	dhi := new(big.Float).Sub(big.NewFloat(vals[hi]), big.NewFloat(ax))
	switch c := dlo.Cmp(dhi); {
	case c < 0, c == 0 && lo&1 == 0:
		return sign | lo
	}
	return sign | hi
}

func TestHalfRoundingMatchesReference(t *testing.T) {
	for _, f := range halfFormats {
		var vals []float64
		for h := uint16(0); h < f.inf; h++ {
			vals = append(vals, f.value(h))
		}
		vals = append(vals, f.beyond)
		bad := 0
		check := func(x float32) {
			if got, want := f.narrow(x), naiveRound(f, vals, x); got != want {
				t.Errorf("%s: %v (%#08x) narrows to %#04x, want %#04x", f.name, x, math.Float32bits(x), got, want)
				bad++
			}
		}
		for i := 0; i+1 < len(vals); i++ {
			mid := float32((vals[i] + vals[i+1]) / 2) // exact: one bit more than the format
			for _, x := range []float32{float32(vals[i]), mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, math.MaxFloat32)} {
				check(x)
				check(-x)
			}
			if bad > 10 {
				t.Fatal("too many errors")
			}
		}
		for _, x := range []float32{math.MaxFloat32, float32(math.Inf(1)), math.SmallestNonzeroFloat32, 0x1p-126, 0x1p-127 + 0x1p-149} {
			check(x)
			check(-x)
		}
	}
}

func TestHalfNaNs(t *testing.T) {
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0x7fbfffff, 0xffc00001, 0xff800100, 0x7fffe000} {
		x := math.Float32frombits(bits)
		if b := ToBF16(x); !math.IsNaN(float64(b.Float32())) || b&0x40 == 0 {
			t.Errorf("ToBF16(%#08x) = %#04x: not a quiet NaN", bits, b)
		}
		if h := ToFP16(x); !math.IsNaN(float64(h.Float32())) || h&0x200 == 0 {
			t.Errorf("ToFP16(%#08x) = %#04x: not a quiet NaN", bits, h)
		}
	}
	if f := FP16(0x7c01).Float32(); math.Float32bits(f)&0x400000 == 0 {
		t.Errorf("FP16(0x7c01).Float32() = %#08x: not a quiet NaN", math.Float32bits(f))
	}
}

// halfTestSlice is n float32s: boundary values first (zeros, infinities,
// NaNs with payloads, float32 and fp16 subnormals, the largest finite
// values and the midpoints towards Inf), then random bit patterns and
// random values in fp16's range.
func halfTestSlice(n int, r *rand.Rand) []float32 {
	edge := []uint32{
		0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff, 0x7fc0ffff,
		0x00000001, 0x807fffff, 0x00400000, 0x00008000, 0x00018000, 0x007f8000, // float32 subnormals (bf16 ties among them)
		0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0xff7f8000, // bf16's overflow edge
		math.Float32bits(65504), math.Float32bits(65519.996), math.Float32bits(65520), math.Float32bits(-65520),
		math.Float32bits(0x1p-24), math.Float32bits(0x1p-25), math.Float32bits(0x1.8p-25), math.Float32bits(0x1p-14 - 0x1p-25),
		0x3f808000, 0x3f818000, 0x3f801000, 0x3f803000, // ties to even for bf16 and fp16
	}
	x := make([]float32, n)
	for i := range x {
		switch {
		case i < len(edge):
			x[i] = math.Float32frombits(edge[i])
		case i%2 == 0:
			x[i] = math.Float32frombits(r.Uint32())
		default:
			x[i] = float32(math.Ldexp(r.Float64()-0.5, r.IntN(44)-26))
		}
	}
	return x
}

// halfKernels are the kernel choices these CPUs may make; each test runs
// the ones the machine has against the Go code.
func halfKernels() []struct {
	name            string
	bf16, avx, f16c bool
} {
	all := []struct {
		name            string
		bf16, avx, f16c bool
	}{{"avx512", halfBF16AVX512, halfAVX512, halfF16C}, {"f16c", false, false, halfF16C}, {"go", false, false, false}}
	return all
}

func TestHalfSlicesMatchGo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, k := range halfKernels() {
		t.Run(k.name, func(t *testing.T) {
			defer func(a, b, c bool) { halfBF16AVX512, halfAVX512, halfF16C = a, b, c }(halfBF16AVX512, halfAVX512, halfF16C)
			halfBF16AVX512, halfAVX512, halfF16C = k.bf16, k.avx, k.f16c
			for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 33, 1001, 4099} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					src := halfTestSlice(n, r)
					// Shift a subnormal into every block so that
					// VCVTNEPS2BF16's fix-up runs next to normal lanes.
					for i := 40; i < n; i += 16 + i%5 {
						src[i] = math.Float32frombits(r.Uint32() & 0x807fffff)
					}
					bf := make([]BF16, n)
					NarrowBF16(bf, src)
					fp := make([]FP16, n)
					NarrowFP16(fp, src)
					for i, x := range src {
						if want := ToBF16(x); bf[i] != want {
							t.Fatalf("NarrowBF16[%d] of %#08x = %#04x, want %#04x", i, math.Float32bits(x), bf[i], want)
						}
						if want := ToFP16(x); fp[i] != want {
							t.Fatalf("NarrowFP16[%d] of %#08x = %#04x, want %#04x", i, math.Float32bits(x), fp[i], want)
						}
					}
					wb := make([]float32, n)
					WidenBF16(wb, bf)
					wf := make([]float32, n)
					WidenFP16(wf, fp)
					for i := range src {
						if want := bf[i].Float32(); math.Float32bits(wb[i]) != math.Float32bits(want) {
							t.Fatalf("WidenBF16[%d] of %#04x = %#08x, want %#08x", i, bf[i], math.Float32bits(wb[i]), math.Float32bits(want))
						}
						if want := fp[i].Float32(); math.Float32bits(wf[i]) != math.Float32bits(want) {
							t.Fatalf("WidenFP16[%d] of %#04x = %#08x, want %#08x", i, fp[i], math.Float32bits(wf[i]), math.Float32bits(want))
						}
					}
				})
			}
		})
	}
}

// TestHalfSlicesAllPatterns widens every 16-bit pattern with the slice
// kernels (so every NaN, subnormal and sNaN passes through the vector
// code) and compares with the scalar methods.
func TestHalfSlicesAllPatterns(t *testing.T) {
	bf := make([]BF16, 1<<16)
	fp := make([]FP16, 1<<16)
	for i := range bf {
		bf[i], fp[i] = BF16(i), FP16(i)
	}
	wb := make([]float32, len(bf))
	wf := make([]float32, len(fp))
	WidenBF16(wb, bf)
	WidenFP16(wf, fp)
	for i := range wb {
		if math.Float32bits(wb[i]) != math.Float32bits(bf[i].Float32()) || math.Float32bits(wf[i]) != math.Float32bits(fp[i].Float32()) {
			t.Fatalf("pattern %#04x: slice widening %#08x, %#08x; scalar %#08x, %#08x", i,
				math.Float32bits(wb[i]), math.Float32bits(wf[i]), math.Float32bits(bf[i].Float32()), math.Float32bits(fp[i].Float32()))
		}
	}
	nb := make([]BF16, len(wb))
	nf := make([]FP16, len(wf))
	NarrowBF16(nb, wb)
	NarrowFP16(nf, wf)
	for i := range nb {
		if nb[i] != ToBF16(wb[i]) || nf[i] != ToFP16(wf[i]) {
			t.Fatalf("pattern %#04x: slice narrowing %#04x, %#04x; scalar %#04x, %#04x", i, nb[i], nf[i], ToBF16(wb[i]), ToFP16(wf[i]))
		}
	}
}

func TestHalfLengthMismatchPanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("no panic")
		}
	}()
	NarrowBF16(make([]BF16, 2), make([]float32, 3))
}
