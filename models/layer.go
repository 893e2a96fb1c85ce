package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Layer is one differentiable stage of a network working on a batch of
// row-major samples.
//
// Forward takes x of shape (batch, in...) — x is borrowed and must stay
// unchanged until Backward — and returns y (batch, out...), owned by the
// layer and valid until its next Forward. Backward takes dy shaped like y
// (borrowed), adds the parameter gradients into the layer's gradient views,
// and returns dx shaped like x, owned by the layer and valid until its next
// Backward.
type Layer interface {
	Forward(x []float32, batch int, train bool) []float32
	Backward(dy []float32) []float32
}

// grow returns buf resized to n, reallocating only when its capacity is
// too small, so steady-state steps do not allocate.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// Linear is a fully connected layer, y = x·Wᵀ + b, with PyTorch's layout:
// W is (Out, In) and b is (Out). x is (batch, In), y is (batch, Out).
type Linear struct {
	In, Out int
	// W, B are views into the network's flat parameter buffer; DW, DB are
	// the matching views into its gradient buffer.
	W, B, DW, DB []float32
	// SkipInputGrad makes Backward skip computing dx (it returns nil), for
	// the first layer of a network whose input needs no gradient.
	SkipInputGrad bool

	x     []float32 // borrowed input of the last Forward
	batch int
	y, dx []float32 // owned
	lp    lowp      // the GEMMs' precision (Network.SetPrecision)
}

// NewLinear returns a Linear layer with no parameter storage; bind its
// W, B, DW, DB to buffers (a Network does this) before use.
func NewLinear(in, out int) *Linear {
	if in < 1 || out < 1 {
		panic(fmt.Sprintf("models: NewLinear(%d, %d): sizes must be positive", in, out))
	}
	return &Linear{In: in, Out: out}
}

// Init fills W and B from U(−1/√In, 1/√In), PyTorch's default for
// nn.Linear (kaiming_uniform with a=√5 for the weight, the same bound for
// the bias), drawing the weight first, then the bias.
func (l *Linear) Init(r *rand.Rand) {
	bound := 1 / math.Sqrt(float64(l.In))
	for i := range l.W {
		l.W[i] = float32((2*r.Float64() - 1) * bound)
	}
	for i := range l.B {
		l.B[i] = float32((2*r.Float64() - 1) * bound)
	}
}

func (l *Linear) checkBound() {
	if len(l.W) != l.Out*l.In || len(l.B) != l.Out || len(l.DW) != len(l.W) || len(l.DB) != len(l.B) {
		panic(fmt.Sprintf("models: Linear(%d→%d): parameter views not bound (len W=%d B=%d DW=%d DB=%d)",
			l.In, l.Out, len(l.W), len(l.B), len(l.DW), len(l.DB)))
	}
}

// Forward computes y = x·Wᵀ + b for x (batch, In); y is (batch, Out).
func (l *Linear) Forward(x []float32, batch int, train bool) []float32 {
	l.checkBound()
	if batch < 1 || len(x) != batch*l.In {
		panic(fmt.Sprintf("models: Linear.Forward: len(x)=%d, want batch %d × In %d", len(x), batch, l.In))
	}
	l.x, l.batch = x, batch
	l.y = grow(l.y, batch*l.Out)
	for i := range batch {
		copy(l.y[i*l.Out:(i+1)*l.Out], l.B)
	}
	l.lp.gemm(false, true, batch, l.Out, l.In, 1, x, l.In, l.W, l.In, 1, l.y, l.Out)
	return l.y
}

// Backward adds dW += dyᵀ·x and db += Σ_batch dy, and returns dx = dy·W
// (batch, In), or nil when SkipInputGrad is set.
func (l *Linear) Backward(dy []float32) []float32 {
	if l.x == nil || len(dy) != l.batch*l.Out {
		panic(fmt.Sprintf("models: Linear.Backward: len(dy)=%d, want batch %d × Out %d (after Forward)", len(dy), l.batch, l.Out))
	}
	l.lp.gemm(true, false, l.Out, l.In, l.batch, 1, dy, l.Out, l.x, l.In, 1, l.DW, l.In)
	for i := range l.batch {
		row := dy[i*l.Out : (i+1)*l.Out]
		for j, v := range row {
			l.DB[j] += v
		}
	}
	if l.SkipInputGrad {
		return nil
	}
	l.dx = grow(l.dx, l.batch*l.In)
	l.lp.gemm(false, false, l.batch, l.In, l.Out, 1, dy, l.Out, l.W, l.In, 0, l.dx, l.In)
	return l.dx
}

// ReLU is the elementwise max(0, x) over any shape.
type ReLU struct {
	// Fused marks a ReLU that the layer before it applies to its own
	// output and gradient (BatchNorm2d.ReLU), in the same
	// pass over memory: Forward returns x and Backward dy, both borrowed.
	// The layer stays in the list so that layer indices, names and
	// checkpointing blocks do not change; its input is the fused layer's
	// output, already ≥ 0 (or NaN), on which max(0, ·) is the identity.
	Fused bool

	n     int       // Fused: the length of the last Forward's x
	y, dx []float32 // owned; y doubles as the mask for Backward
}

// Forward returns max(0, x), shaped like x.
func (l *ReLU) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x)%batch != 0 {
		panic(fmt.Sprintf("models: ReLU.Forward: len(x)=%d is not a multiple of batch %d", len(x), batch))
	}
	if l.Fused {
		l.n = len(x)
		return x
	}
	l.y = grow(l.y, len(x))
	reluTo(l.y, x)
	return l.y
}

// reluTo sets dst = max(x, 0) elementwise (dst may be x).
func reluTo(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = max(v, 0)
	}
}

// Backward returns dx = dy where the input was positive, 0 elsewhere (the
// subgradient at 0 is 0, as in PyTorch).
func (l *ReLU) Backward(dy []float32) []float32 {
	if l.Fused {
		if len(dy) != l.n {
			panic(fmt.Sprintf("models: ReLU.Backward: len(dy)=%d, want %d", len(dy), l.n))
		}
		return dy
	}
	if len(dy) != len(l.y) {
		panic(fmt.Sprintf("models: ReLU.Backward: len(dy)=%d, want %d", len(dy), len(l.y)))
	}
	l.dx = grow(l.dx, len(dy))
	reluMask(l.dx, dy, l.y)
	return l.dx
}

// reluMask sets dx = dy where y > 0 and 0 where y == 0, for y a ReLU
// output (never negative). It is branch-free: ReLU outputs are positive
// about half the time at random, which defeats branch prediction.
func reluMask(dx, dy, y []float32) {
	dy, y = dy[:len(dx)], y[:len(dx)]
	for i, v := range y {
		dx[i] = reluGate(dy[i], v)
	}
}

// reluGate returns d if the ReLU output y is positive and 0 if it is 0,
// without a branch.
func reluGate(d, y float32) float32 {
	// bits > 0 (a positive float, +Inf or a NaN) gives −bits < 0, whose
	// sign fills the mask; bits == 0 gives 0.
	bits := int32(math.Float32bits(y))
	mask := uint32((-bits) >> 31)
	return math.Float32frombits(math.Float32bits(d) & mask)
}

// Flatten turns (batch, C, H, W) into (batch, C·H·W). Row-major storage is
// unchanged, so Forward returns x itself and Backward returns dy itself
// (both borrowed, not copied).
type Flatten struct{ n int }

// Forward returns x.
func (l *Flatten) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x)%batch != 0 {
		panic(fmt.Sprintf("models: Flatten.Forward: len(x)=%d is not a multiple of batch %d", len(x), batch))
	}
	l.n = len(x)
	return x
}

// Backward returns dy.
func (l *Flatten) Backward(dy []float32) []float32 {
	if len(dy) != l.n {
		panic(fmt.Sprintf("models: Flatten.Backward: len(dy)=%d, want %d", len(dy), l.n))
	}
	return dy
}
