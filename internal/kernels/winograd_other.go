//go:build !amd64

package kernels

// winoSIMD is false: there are no vector kernels for this architecture.
var winoSIMD = false

func winoInput8(dst *float32, s int, r0, r1, r2, r3 *float32) {
	panic("kernels: winoInput8 without SIMD")
}

func winoInputGrad8(t0, t1, t2, t3, dv *float32, s int, mask *float32) {
	panic("kernels: winoInputGrad8 without SIMD")
}

func winoRowT(r0, r1, r2, r3, t0, t1, t2, t3 *float32, n int) {
	panic("kernels: winoRowT without SIMD")
}

func winoOutputRows(y *float32, ow int, m *float32, s, n, rows, mskip int, b float32, relu bool) {
	panic("kernels: winoOutputRows without SIMD")
}

func winoOutputPool8(y *float32, arg *uint8, m *float32, s, n int, b float32, relu bool) {
	panic("kernels: winoOutputPool8 without SIMD")
}

func winoOutputGradRows(dm *float32, s int, dy *float32, ow, n, rows, mskip int) {
	panic("kernels: winoOutputGradRows without SIMD")
}

func winoOutputPoolGrad8(dm *float32, s int, dy *float32, arg *uint8, y *float32, n int, sum *[4]float32) {
	panic("kernels: winoOutputPoolGrad8 without SIMD")
}

func winoTranspose(dst *float32, ldd int, src *float32, lds, rb, cb int) {
	panic("kernels: winoTranspose without SIMD")
}
