package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Sigmoid is the elementwise logistic function 1/(1 + e^−x) over any
// shape (torch.nn.Sigmoid).
type Sigmoid struct {
	y, dx []float32 // owned; y is kept for Backward
}

// Forward returns σ(x), shaped like x.
func (l *Sigmoid) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x)%batch != 0 {
		panic(fmt.Sprintf("models: Sigmoid.Forward: len(x)=%d is not a multiple of batch %d", len(x), batch))
	}
	l.y = grow(l.y, len(x))
	for i, v := range x {
		l.y[i] = float32(1 / (1 + math.Exp(-float64(v))))
	}
	return l.y
}

// Backward returns dy·σ(x)·(1 − σ(x)).
func (l *Sigmoid) Backward(dy []float32) []float32 {
	if len(dy) != len(l.y) || l.y == nil {
		panic(fmt.Sprintf("models: Sigmoid.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	l.dx = grow(l.dx, len(dy))
	for i, s := range l.y {
		l.dx[i] = dy[i] * s * (1 - s)
	}
	return l.dx
}

// SqueezeExcite is squeeze-and-excitation channel attention (Hu et al.
// 2018), as torchvision.ops.SqueezeExcitation(C, Hidden): each sample's
// channels are averaged (squeeze), passed through FC1 (C → Hidden), ReLU,
// FC2 (Hidden → C) and a sigmoid, and the input's channel c is scaled by
// the c-th result (excitation):
//
//	a = σ(FC2(ReLU(FC1(mean_hw x))))     (batch, C)
//	y[n, c, :] = a[n, c] · x[n, c, :]
//
// x and y are (batch, C, HW) for any plane size. FC1 and FC2 are Linear
// layers; the network names their views fc1.weight (Hidden, C, 1, 1),
// fc1.bias, fc2.weight (C, Hidden, 1, 1) and fc2.bias, torchvision's
// 1×1-convolution layout, which is the Linear's memory layout.
type SqueezeExcite struct {
	C, Hidden int
	FC1, FC2  *Linear

	pool GlobalAvgPool
	relu ReLU
	sig  Sigmoid

	x         []float32 // borrowed input of the last Forward
	a         []float32 // borrowed: the sigmoid's output (batch, C)
	batch, hw int
	y, dx, da []float32 // owned
}

// NewSqueezeExcite returns squeeze-and-excitation over c channels with a
// hidden layer of the given width; bind FC1's and FC2's views before use.
func NewSqueezeExcite(c, hidden int) *SqueezeExcite {
	if c < 1 || hidden < 1 {
		panic(fmt.Sprintf("models: NewSqueezeExcite(%d, %d): sizes must be positive", c, hidden))
	}
	return &SqueezeExcite{C: c, Hidden: hidden, FC1: NewLinear(c, hidden), FC2: NewLinear(hidden, c), pool: GlobalAvgPool{C: c}}
}

// Init draws both projections as nn.Conv2d's (and nn.Linear's) default,
// U(±1/√fan_in) for weight then bias, FC1 first.
func (l *SqueezeExcite) Init(r *rand.Rand) {
	l.FC1.Init(r)
	l.FC2.Init(r)
}

// Forward returns x with every channel scaled by its attention weight.
func (l *SqueezeExcite) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x) == 0 || len(x)%(batch*l.C) != 0 {
		panic(fmt.Sprintf("models: SqueezeExcite.Forward: len(x)=%d is not batch %d × C %d × H·W", len(x), batch, l.C))
	}
	l.x, l.batch, l.hw = x, batch, len(x)/(batch*l.C)
	s := l.pool.Forward(x, batch, train)
	h := l.relu.Forward(l.FC1.Forward(s, batch, train), batch, train)
	l.a = l.sig.Forward(l.FC2.Forward(h, batch, train), batch, train)
	l.y = grow(l.y, len(x))
	for p, a := range l.a {
		xs, ys := x[p*l.hw:(p+1)*l.hw], l.y[p*l.hw:(p+1)*l.hw]
		for i, v := range xs {
			ys[i] = a * v
		}
	}
	return l.y
}

// Backward adds the projections' gradients and returns dx = a·dy plus the
// gradient that reaches x through the squeeze.
func (l *SqueezeExcite) Backward(dy []float32) []float32 {
	if l.x == nil || len(dy) != len(l.x) {
		panic(fmt.Sprintf("models: SqueezeExcite.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.x)))
	}
	l.da = grow(l.da, len(l.a))
	for p := range l.a {
		l.da[p] = dotTo(dy[p*l.hw:(p+1)*l.hw], l.x[p*l.hw:(p+1)*l.hw])
	}
	ds := l.FC1.Backward(l.relu.Backward(l.FC2.Backward(l.sig.Backward(l.da))))
	dpool := l.pool.Backward(ds)
	l.dx = grow(l.dx, len(dy))
	for p, a := range l.a {
		d, dp, dx := dy[p*l.hw:(p+1)*l.hw], dpool[p*l.hw:(p+1)*l.hw], l.dx[p*l.hw:(p+1)*l.hw]
		for i, v := range d {
			dx[i] = a*v + dp[i]
		}
	}
	return l.dx
}

// dotTo returns Σ a[i]·b[i] over len(a) in four float32 lanes (as sum32).
func dotTo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
