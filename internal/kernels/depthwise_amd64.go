//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// dwSIMD selects the AVX-512 depthwise kernels (a variable so that tests
// can run the Go code on the same machine).
var dwSIMD = dwAVX512

// dwAVX512 reports the AVX-512 the depthwise kernels need (masked
// 512-bit FMAs and 16-bit mask loads: AVX512F).
var dwAVX512 = cpu.X86.HasAVX512F

// dw3x3Planes computes planes consecutive H×W planes (hw values, rows of
// width values) of the stride-1, padding-1 3×3 convolution: plane q of y
// from plane q of x with the nine weights at w[9q:] (the nine in reverse
// order when flip is set: the input gradient). chunks are the plane's
// dwPlan.
//
//go:noescape
func dw3x3Planes(y, x, w *float32, planes, hw, width int, chunks *dwChunk, nchunks int, flip bool)

// dw3x3GradPlanes adds to dw[9q+t] the sum over plane q of dy times
// the input that tap t read (the filter gradient), for planes
// consecutive planes with weights at dw[9q:].
//
//go:noescape
func dw3x3GradPlanes(dw, dy, x *float32, planes, hw, width int, chunks *dwChunk, nchunks int)

// dwPlanes runs dw3x3Planes over batch samples of c channels each.
func dwPlanes(y, x, w []float32, c, batch, hw, width int, p *dwPlan, flip bool) {
	n := c * hw
	_ = y[batch*n-1]
	_ = x[batch*n-1]
	_ = w[9*c-1]
	for s := range batch {
		dw3x3Planes(&y[s*n], &x[s*n], &w[0], c, hw, width, &p.chunks[0], len(p.chunks), flip)
	}
}

// dwGradPlanes runs dw3x3GradPlanes over batch samples of c channels
// each.
func dwGradPlanes(dw, dy, x []float32, c, batch, hw, width int, p *dwPlan) {
	n := c * hw
	_ = dy[batch*n-1]
	_ = x[batch*n-1]
	_ = dw[9*c-1]
	for s := range batch {
		dw3x3GradPlanes(&dw[0], &dy[s*n], &x[s*n], c, hw, width, &p.chunks[0], len(p.chunks))
	}
}
