//go:build amd64

package kernels

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

// winoOutputRows writes Aᵀ·m·A + b (then max(·, 0) when relu is set) of
// rows ≥ 1 rows of n ≥ 8 neighbouring tiles: tile k of row r has its
// points at m[ξ·s + r·(n+mskip) + k] and its outputs at y[r·2·ow + 2k],
// y[r·2·ow + 2k+1] and the same one row of y down. Each row goes in blocks
// of 8 tiles, the last one moved back to end at the row's last tile: the
// same operations in the same order as outputTile and the Go code's bias
// and max, so the same values.
//
//go:noescape
func winoOutputRows(y *float32, ow int, m *float32, s, n, rows, mskip int, b float32, relu bool)

// winoOutputPool8 is winoOutputRows followed by WinogradOutputPool's 2×2 max
// (and arg) of each of n ≥ 8 consecutive tiles, written to y[k] and
// arg[k]: the same values as the Go code applied to outputTile's.
//
//go:noescape
func winoOutputPool8(y *float32, arg *uint8, m *float32, s, n int, b float32, relu bool)

// winoOutputGradRows writes A·g·Aᵀ of rows ≥ 1 rows of n ≥ 8
// neighbouring tiles (laid out as for winoOutputRows), whose output
// gradients are dy[r·2·ow + 2k], dy[r·2·ow + 2k+1] and the same one row
// down, to dm[ξ·s + r·(n+mskip) + k], as outputGradTile does.
//
//go:noescape
func winoOutputGradRows(dm *float32, s int, dy *float32, ow, n, rows, mskip int)

// winoOutputPoolGrad8 is winoOutputGradRows for the first n − n%8 tiles of a
// fused pool: tile k's gradient is d = dy[k] at position arg[k]&3 and 0
// elsewhere, with d first gated by the ReLU (0 unless −bits(y[k]) is a
// negative int32, as in poolGradTerm) when y is not nil. It adds d
// to sum[k%4], in order: sum32's accumulators.
//
//go:noescape
func winoOutputPoolGrad8(dm *float32, s int, dy *float32, arg *uint8, y *float32, n int, sum *[4]float32)

// winoTranspose sets dst[j·ldd + i] = src[i·lds + j] for i < 8·rb and
// j < 8·cb (rb, cb ≥ 1), in 8×8 blocks.
//
//go:noescape
func winoTranspose(dst *float32, ldd int, src *float32, lds, rb, cb int)
