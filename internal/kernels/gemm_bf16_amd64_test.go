//go:build amd64

package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPackBF16AMatchesNaive checks packBF16A (whose whole blocks of 8
// untransposed rows run packPairsA8) against the layout it documents,
// written out element by element: row counts around the block size, odd
// and even K blocks, K offsets and odd strides, transposed or not, into a
// buffer holding an earlier pack's values.
func TestPackBF16AMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, m := range []int{1, 7, 8, 9, 16, 17, 33} {
		for _, kc := range []int{1, 2, 3, 8, 255, 256} {
			for _, trans := range []bool{false, true} {
				t.Run(fmt.Sprintf("m%d/kc%d/trans=%v", m, kc, trans), func(t *testing.T) {
					k0 := 3
					k := k0 + kc
					lda := k + 1 // odd: rows start at odd elements
					if trans {
						lda = m + 3
					}
					a := make([]BF16, operandRows(trans, m, k)*lda)
					for i := range a {
						a[i] = BF16(r.Uint32())
					}
					opA := func(i, p int) BF16 {
						if trans {
							return a[p*lda+i]
						}
						return a[i*lda+p]
					}
					kp := (kc + 1) / 2
					mBlocks := (m + bf16MR - 1) / bf16MR
					dst := make([]BF16, mBlocks*bf16MR*2*kp)
					for i := range dst {
						dst[i] = BF16(r.Uint32()) // stale values
					}
					packBF16A(dst, trans, a, lda, m, k0, kc)
					for ib := range mBlocks {
						for p := range kp {
							for i := range bf16MR {
								for h := range 2 {
									var want BF16
									if row, col := ib*bf16MR+i, 2*p+h; row < m && col < kc {
										want = opA(row, k0+col)
									}
									if got := dst[ib*bf16MR*2*kp+2*(bf16MR*p+i)+h]; got != want {
										t.Fatalf("block %d pair %d row %d half %d: %#04x, want %#04x", ib, p, i, h, got, want)
									}
								}
							}
						}
					}
				})
			}
		}
	}
}

// operandRows is the number of rows of storage op(a) (r×c) reads.
func operandRows(trans bool, r, c int) int {
	if trans {
		return c
	}
	return r
}

// TestPackBF16BMatchesNaive checks packBF16B (whose whole 32-column
// panels run packPairs32, or packPairs8 when transposed) against the
// layout it documents, as TestPackBF16AMatchesNaive does for A.
func TestPackBF16BMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, nr := range []int{1, 8, 31, 32} {
		for _, kc := range []int{1, 2, 3, 8, 255, 256} {
			for _, trans := range []bool{false, true} {
				t.Run(fmt.Sprintf("nr%d/kc%d/trans=%v", nr, kc, trans), func(t *testing.T) {
					k0, j0 := 5, 2
					k, n := k0+kc, j0+nr
					ldb := n + 1
					if trans {
						ldb = k + 1 // odd: columns start at odd elements
					}
					b := make([]BF16, operandRows(trans, k, n)*ldb)
					for i := range b {
						b[i] = BF16(r.Uint32())
					}
					opB := func(p, j int) BF16 {
						if trans {
							return b[j*ldb+p]
						}
						return b[p*ldb+j]
					}
					kp := (kc + 1) / 2
					dst := make([]BF16, 2*bf16NR*kp)
					for i := range dst {
						dst[i] = BF16(r.Uint32()) // stale values
					}
					packBF16B(dst, trans, b, ldb, k0, kc, j0, nr)
					for p := range kp {
						for j := range bf16NR {
							for h := range 2 {
								var want BF16
								if row := 2*p + h; j < nr && row < kc {
									want = opB(k0+row, j0+j)
								}
								if got := dst[2*(bf16NR*p+j)+h]; got != want {
									t.Fatalf("pair %d column %d half %d: %#04x, want %#04x", p, j, h, got, want)
								}
							}
						}
					}
				})
			}
		}
	}
}
