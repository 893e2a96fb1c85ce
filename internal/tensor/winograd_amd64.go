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

// winoInputGrad8 adds the adjoint of the column pass of the 8 tiles whose
// dv are dv[ξ·s + k], k = 0..7, into the strip rows t0..t3 (each holding
// the row pass's output from the first tile's column; 18 values of each
// are updated); mask points to 8 values, all bits set for a tile to
// include and 0 for one to skip. Each position's contributions from two
// neighbouring tiles are summed before being added (the same value as the
// Go code's two additions into a position that starts at 0).
//
//go:noescape
func winoInputGrad8(t0, t1, t2, t3, dv *float32, s int, mask *float32)

// winoRowT adds the adjoint of the row pass of the strip rows t0..t3 into
// the input rows r0..r3 over the first n − n%8 columns: r0 += a,
// r1 += (b−c)+d, r2 += (b+c)−a, r3 −= d, as the Go code does.
//
//go:noescape
func winoRowT(r0, r1, r2, r3, t0, t1, t2, t3 *float32, n int)
