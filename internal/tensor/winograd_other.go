//go:build !amd64

package tensor

// winoSIMD is false: there are no vector kernels for this architecture.
var winoSIMD = false

func winoInput8(dst *float32, s int, r0, r1, r2, r3 *float32) {
	panic("tensor: winoInput8 without SIMD")
}
