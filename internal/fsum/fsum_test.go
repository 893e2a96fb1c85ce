package fsum

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// naive is the reference: the loop the collectives used before.
func naive(dst, src []float32) {
	for i, v := range src[:len(dst)] {
		dst[i] += v
	}
}

func randVals(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		switch r.IntN(50) {
		case 0:
			v[i] = float32(math.Inf(1 - 2*r.IntN(2)))
		case 1:
			v[i] = float32(math.NaN())
		case 2:
			v[i] = math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal or ±0
		default:
			v[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(20)-10)))
		}
	}
	return v
}

func bitsEqual(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			return false
		}
	}
	return true
}

// TestMatchesNaive compares Add and AddLE with the naive loop, bit for
// bit, at lengths around the unrolling boundaries.
func TestMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099} {
		dst, src := randVals(r, n), randVals(r, n)
		want := append([]float32(nil), dst...)
		naive(want, src)

		got := append([]float32(nil), dst...)
		Add(got, src)
		if !bitsEqual(got, want) {
			t.Errorf("Add, n=%d: differs from the naive loop", n)
		}

		// AddLE from bytes at every misalignment.
		for shift := range 4 {
			b := make([]byte, shift+4*n)[shift:]
			for i, v := range src {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
			got := append([]float32(nil), dst...)
			AddLE(got, b)
			if !bitsEqual(got, want) {
				t.Errorf("AddLE, n=%d, shift %d: differs from the naive loop", n, shift)
			}
		}
	}
}

func TestLengthMismatchPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Add":   func() { Add(make([]float32, 3), make([]float32, 2)) },
		"AddLE": func() { AddLE(make([]float32, 3), make([]byte, 11)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic on a length mismatch", name)
				}
			}()
			f()
		}()
	}
}

// TestAddKernels compares Add with the naive loop, bit for bit, with and
// without the vector kernel, at every length 0..70 and around 1 MiB,
// with dst and src at odd offsets into larger arrays (so the kernel sees
// every misalignment), and checks that nothing around dst is written.
func TestAddKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	old := addAVX2On
	t.Cleanup(func() { addAVX2On = old })
	lengths := []int{1<<18 - 1, 1 << 18, 1<<18 + 33}
	for n := range 71 {
		lengths = append(lengths, n)
	}
	for _, simd := range []bool{false, true} {
		if simd && !old {
			t.Log("no vector kernel on this CPU: only the Go loop is tested")
			continue
		}
		addAVX2On = simd
		for _, n := range lengths {
			for _, off := range []struct{ d, s int }{{0, 0}, {1, 3}, {3, 0}, {5, 7}} {
				dbuf, sbuf := randVals(r, n+off.d+9), randVals(r, n+off.s+9)
				dst, src := dbuf[off.d:off.d+n], sbuf[off.s:off.s+n]
				want := append([]float32(nil), dbuf...)
				naive(want[off.d:off.d+n], src)
				Add(dst, src)
				if !bitsEqual(dbuf, want) {
					t.Fatalf("simd=%v n=%d offsets %+v: differs from the naive loop (or wrote outside dst)", simd, n, off)
				}
			}
		}
	}
}
