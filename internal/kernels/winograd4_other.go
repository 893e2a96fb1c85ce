//go:build !amd64 && winograd4

package kernels

func wino4In8(dst *float32, s int, img *float32, idx *int32, w int, buf *float32) {
	panic("kernels: wino4In8 without SIMD")
}

func wino4InT8(buf *float32, dv *float32, s int) {
	panic("kernels: wino4InT8 without SIMD")
}

func wino4Out8(buf *float32, m *float32, s int) {
	panic("kernels: wino4Out8 without SIMD")
}

func wino4OutT8(dm *float32, s int, buf *float32) {
	panic("kernels: wino4OutT8 without SIMD")
}
