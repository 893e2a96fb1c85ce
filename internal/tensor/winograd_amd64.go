//go:build amd64

package tensor

import "golang.org/x/sys/cpu"

// winoSIMD selects the AVX2 kernels of the Winograd input transform (a
// variable so that tests can run the Go code on the same machine).
var winoSIMD = cpu.X86.HasAVX2

// winoInput8 writes Bᵀ·d·B of the 8 neighbouring tiles whose 4×4 patches
// start at r0[0], r0[2], …, r0[14] (rows r0, r1, r2, r3 of the input; 18
// values of each are read) to dst[ξ·s + k], k = 0..7, ξ = 0..15: the same
// additions in the same order as the Go code, so the same values.
//
//go:noescape
func winoInput8(dst *float32, s int, r0, r1, r2, r3 *float32)
