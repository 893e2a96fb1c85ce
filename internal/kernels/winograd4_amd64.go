//go:build amd64 && winograd4

package kernels

// The AVX2 kernels of F(4×4, 3×3), 8 tiles at a time (one per vector
// lane), with the same operations in the same order as the Go code
// (in4, in4T, out4, out4T), so the same values. buf is scratch of at
// least 320 values; lane k of value e is buf[8·e + k].

// wino4In8 gathers the 6×6 patches of 8 tiles, tile k's at
// img[idx[k] + i·w + j], and writes Bᵀ·d·B to dst[ξ·s + k].
//
//go:noescape
func wino4In8(dst *float32, s int, img *float32, idx *int32, w int, buf *float32)

// wino4InT8 sets buf[8·e + k], e = 0..35, to B·dv·Bᵀ of tile k, whose
// points are dv[ξ·s + k].
//
//go:noescape
func wino4InT8(buf *float32, dv *float32, s int)

// wino4Out8 sets buf[8·e + k], e = 0..15, to Aᵀ·m·A of tile k, whose
// points are m[ξ·s + k] (buf[128:320] is scratch).
//
//go:noescape
func wino4Out8(buf *float32, m *float32, s int)

// wino4OutT8 writes A·e·Aᵀ of tile k to dm[ξ·s + k], where e is
// buf[8·e + k], e = 0..15 (buf[128:320] is scratch).
//
//go:noescape
func wino4OutT8(dm *float32, s int, buf *float32)
