//go:build amd64

package optim

import "golang.org/x/sys/cpu"

// The unscale kernels in use (variables so that tests can run the others
// on the same machine).
var (
	unscaleAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ // VFPCLASSPS is DQ
	unscaleAVX2   = cpu.X86.HasAVX2
)

// unscale16 and unscale8 multiply the n values at p (n a multiple of 16,
// or of 8) by inv unless mul is false, and report whether all of them
// were finite before.
//
//go:noescape
func unscale16(p *float32, n int, inv float32, mul bool) (finite bool)

//go:noescape
func unscale8(p *float32, n int, inv float32, mul bool) (finite bool)

// unscaleSIMD unscales a prefix of grads with the CPU's kernel and
// returns its length (0 without one) and whether it was all finite.
func unscaleSIMD(grads []float32, inv float32) (int, bool) {
	switch {
	case unscaleAVX512 && len(grads) >= 16:
		n := len(grads) &^ 15
		return n, unscale16(&grads[0], n, inv, inv != 1)
	case unscaleAVX2 && len(grads) >= 8:
		n := len(grads) &^ 7
		return n, unscale8(&grads[0], n, inv, inv != 1)
	}
	return 0, true
}
