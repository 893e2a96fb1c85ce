//go:build amd64

package fsum

import "golang.org/x/sys/cpu"

// addAVX2On says whether Add uses the AVX2 kernel (a variable so that
// tests can run the Go loop on the same machine).
var addAVX2On = cpu.X86.HasAVX2

// add32 sets dst[i] += src[i] for the n values at dst and src (n a
// positive multiple of 32) with VADDPS, which adds lane by lane exactly
// as ADDSS does: the same correctly rounded float32 sums as the naive
// loop, with no reassociation.
//
//go:noescape
func add32(dst, src *float32, n int)

// addSIMD adds a prefix of src into dst with the CPU's kernel and returns
// its length (0 without one).
func addSIMD(dst, src []float32) int {
	if !addAVX2On || len(dst) < 32 {
		return 0
	}
	n := len(dst) &^ 31
	add32(&dst[0], &src[0], n)
	return n
}
