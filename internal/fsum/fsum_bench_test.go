package fsum

import (
	"testing"
	"unsafe"
)

// BenchmarkAdd compares the sums (Add-go: without the vector kernel) with
// the naive loop and with a copy of the same size (1 MiB, the collectives' default frame).
func BenchmarkAdd(b *testing.B) {
	const n = 1 << 18
	dst, src := make([]float32, n), make([]float32, n)
	bs := unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*n)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"naive", func() { naive(dst, src) }},
		{"Add", func() { Add(dst, src) }},
		{"Add-go", func() { on := addAVX2On; addAVX2On = false; Add(dst, src); addAVX2On = on }},
		{"AddLE", func() { AddLE(dst, bs) }},
		{"copy", func() { copy(dst, src) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(4 * n)
			for b.Loop() {
				c.f()
			}
		})
	}
}
