package kernels

import "fmt"

// Batch-norm kernels: float64 sums over float32 data in sixteen
// independent lanes (Acc64), and the two elementwise passes of
// BatchNorm2d (BNNormalize, BNInputGrad). A running float64 total is one
// dependent add per value (the add's latency, several cycles each); sixteen
// lanes let the adds overlap, and AVX-512 does them eight at a time. The
// vector and Go code do the same operations in the same order on every
// lane, so they agree bit for bit.

// Acc64 is sixteen float64 running sums. Values are added in blocks of
// sixteen, value j of a block to lane j; a slice's last len%16 values go
// to lanes 0, 1, … in turn. Sum reduces the lanes in a fixed tree.
type Acc64 [16]float64

// AddF32 adds every value of x.
func (a *Acc64) AddF32(x []float32) {
	n := len(x) &^ 15
	if n > 0 {
		accSum(a, x[:n])
	}
	for i, v := range x[n:] {
		a[i] += float64(v)
	}
}

// AddSqDev adds (x[i] − mu)² for every value, computed in float64.
func (a *Acc64) AddSqDev(x []float32, mu float64) {
	n := len(x) &^ 15
	if n > 0 {
		accSqDev(a, x[:n], mu)
	}
	for i, v := range x[n:] {
		d := float64(v) - mu
		a[i] += d * d
	}
}

// AddDot adds every dy[i] to a and dy[i]·x[i] (in float64) to b.
func (a *Acc64) AddDot(b *Acc64, dy, x []float32) {
	if len(x) != len(dy) {
		panic(fmt.Sprintf("kernels: Acc64.AddDot: len(dy)=%d, len(x)=%d", len(dy), len(x)))
	}
	n := len(dy) &^ 15
	if n > 0 {
		accDot(a, b, dy[:n], x[:n])
	}
	for i, d := range dy[n:] {
		a[i] += float64(d)
		b[i] += float64(d) * float64(x[n+i])
	}
}

// Sum returns the lanes' total: lane j plus lane j+8, then j+4, j+2,
// j+1.
func (a *Acc64) Sum() float64 {
	var s [8]float64
	for j := range 8 {
		s[j] = a[j] + a[j+8]
	}
	for j := range 4 {
		s[j] += s[j+4]
	}
	s[0] += s[2]
	s[1] += s[3]
	return s[0] + s[1]
}

// AddDotNorm is AddDot on x̂[i] = (x[i] − mean)·inv (float32, as
// BNNormalize computes it) in place of x: batch norm's backward sums
// from its input, without a stored x̂.
func (a *Acc64) AddDotNorm(b *Acc64, dy, x []float32, mean, inv float32) {
	if len(x) != len(dy) {
		panic(fmt.Sprintf("kernels: Acc64.AddDotNorm: len(dy)=%d, len(x)=%d", len(dy), len(x)))
	}
	n := len(dy) &^ 15
	if n > 0 {
		accDotNorm(a, b, dy[:n], x[:n], mean, inv)
	}
	for i, d := range dy[n:] {
		h := (x[n+i] - mean) * inv
		a[i] += float64(d)
		b[i] += float64(d) * float64(h)
	}
}

// BNNormalize sets xhat[i] = (x[i] − mean)·inv and y[i] = xhat[i]·g + b,
// each operation rounded to float32 (no fused multiply-add). xhat may be
// nil: then only y is written.
func BNNormalize(xhat, y, x []float32, mean, inv, g, b float32) {
	if xhat != nil && len(xhat) != len(x) || len(y) != len(x) {
		panic(fmt.Sprintf("kernels: BNNormalize: len(xhat)=%d len(y)=%d len(x)=%d", len(xhat), len(y), len(x)))
	}
	n := len(x) &^ 15
	if xhat == nil {
		if n > 0 && bnNormalizeYSIMD(y[:n], x[:n], mean, inv, g, b) {
			x, y = x[n:], y[n:]
		}
		y = y[:len(x)]
		for i, v := range x {
			h := (v - mean) * inv
			y[i] = h*g + b
		}
		return
	}
	if n > 0 && bnNormalizeSIMD(xhat[:n], y[:n], x[:n], mean, inv, g, b) {
		x, xhat, y = x[n:], xhat[n:], y[n:]
	}
	y = y[:len(x)]
	xhat = xhat[:len(x)]
	for i, v := range x {
		h := (v - mean) * inv
		xhat[i] = h
		y[i] = h*g + b
	}
}

// BNInputGrad sets dx[i] = k·((dy[i] − meanDy) − xhat[i]·meanDyx), each
// operation rounded to float32: batch norm's input gradient.
func BNInputGrad(dx, dy, xhat []float32, k, meanDy, meanDyx float32) {
	if len(dy) != len(dx) || len(xhat) != len(dx) {
		panic(fmt.Sprintf("kernels: BNInputGrad: len(dx)=%d len(dy)=%d len(xhat)=%d", len(dx), len(dy), len(xhat)))
	}
	n := len(dx) &^ 15
	if n > 0 && bnInputGradSIMD(dx[:n], dy[:n], xhat[:n], k, meanDy, meanDyx) {
		dx, dy, xhat = dx[n:], dy[n:], xhat[n:]
	}
	dy = dy[:len(dx)]
	xhat = xhat[:len(dx)]
	for i, d := range dy {
		dx[i] = k * (d - meanDy - xhat[i]*meanDyx)
	}
}

// BNInputGradNorm is BNInputGrad on x̂[i] = (x[i] − mean)·inv (float32,
// as BNNormalize computes it) in place of a stored x̂.
func BNInputGradNorm(dx, dy, x []float32, mean, inv, k, meanDy, meanDyx float32) {
	if len(dy) != len(dx) || len(x) != len(dx) {
		panic(fmt.Sprintf("kernels: BNInputGradNorm: len(dx)=%d len(dy)=%d len(x)=%d", len(dx), len(dy), len(x)))
	}
	n := len(dx) &^ 15
	if n > 0 && bnInputGradNormSIMD(dx[:n], dy[:n], x[:n], mean, inv, k, meanDy, meanDyx) {
		dx, dy, x = dx[n:], dy[n:], x[n:]
	}
	dy = dy[:len(dx)]
	x = x[:len(dx)]
	for i, d := range dy {
		h := (x[i] - mean) * inv
		dx[i] = k * (d - meanDy - h*meanDyx)
	}
}

func accDotNormGo(a, b *Acc64, dy, x []float32, mean, inv float32) {
	for i := 0; i+16 <= len(dy); i += 16 {
		d, xb := dy[i:i+16:i+16], x[i:i+16:i+16]
		for j, v := range d {
			h := (xb[j] - mean) * inv
			a[j] += float64(v)
			b[j] += float64(v) * float64(h)
		}
	}
}

// accSumGo, accSqDevGo and accDotGo are the block loops (len a multiple
// of 16) in Go.
func accSumGo(a *Acc64, x []float32) {
	for i := 0; i+16 <= len(x); i += 16 {
		blk := x[i : i+16 : i+16]
		for j, v := range blk {
			a[j] += float64(v)
		}
	}
}

func accSqDevGo(a *Acc64, x []float32, mu float64) {
	for i := 0; i+16 <= len(x); i += 16 {
		blk := x[i : i+16 : i+16]
		for j, v := range blk {
			d := float64(v) - mu
			a[j] += d * d
		}
	}
}

func accDotGo(a, b *Acc64, dy, x []float32) {
	for i := 0; i+16 <= len(dy); i += 16 {
		d, xb := dy[i:i+16:i+16], x[i:i+16:i+16]
		for j, v := range d {
			a[j] += float64(v)
			b[j] += float64(v) * float64(xb[j])
		}
	}
}
