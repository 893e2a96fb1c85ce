// Package fsum holds the element-wise float32 sums of the ring
// collectives: dst += src over float32 slices and over little-endian wire
// bytes, unrolled so that the compiler drops bounds checks and keeps
// several independent additions in flight. On amd64 with AVX2, Add runs
// an assembly kernel (chosen at run time) over the multiple-of-32 prefix:
// VADDPS adds each lane on its own, so it computes exactly what ADDSS,
// and the Go loop, compute.
//
// Every function adds element by element in index order, exactly as the
// naive loop `for i := range dst { dst[i] += src[i] }` does, so results are
// bit-identical to it (float32 addition of two operands is correctly
// rounded; there is no reassociation).
package fsum

import (
	"encoding/binary"
	"math"
)

// Add sets dst[i] += src[i] for every i. len(src) must be len(dst).
func Add(dst, src []float32) {
	if len(src) != len(dst) {
		panic("fsum: Add: len(src) != len(dst)")
	}
	if n := addSIMD(dst, src); n > 0 {
		dst, src = dst[n:], src[n:]
	}
	for len(dst) >= 8 {
		d, s := dst[:8:8], src[:8:8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
		dst, src = dst[8:], src[8:]
	}
	for i := range dst {
		dst[i] += src[i]
	}
}

// AddLE sets dst[i] += the float32 stored little-endian in src[4i:4i+4].
// len(src) must be 4*len(dst).
func AddLE(dst []float32, src []byte) {
	if len(src) != 4*len(dst) {
		panic("fsum: AddLE: len(src) != 4*len(dst)")
	}
	le := binary.LittleEndian
	for len(dst) >= 4 {
		d, s := dst[:4:4], src[:16:16]
		d[0] += math.Float32frombits(le.Uint32(s[0:]))
		d[1] += math.Float32frombits(le.Uint32(s[4:]))
		d[2] += math.Float32frombits(le.Uint32(s[8:]))
		d[3] += math.Float32frombits(le.Uint32(s[12:]))
		dst, src = dst[4:], src[16:]
	}
	for i := range dst {
		dst[i] += math.Float32frombits(le.Uint32(src[4*i:]))
	}
}
