package models

import "fmt"

// ConvMaxPool is a Conv2D followed by a MaxPool2D (with the pool's fused
// ReLU, if set), as one layer. When the convolution takes the Winograd
// path and the pool has 2×2 windows with stride 2 over an output of even
// height and width, the pool's windows are exactly the Winograd output
// tiles: the pool is then taken inside the output transform
// (tensor.WinogradOutputPool) and its gradient inside the output
// gradient's, so the full-size convolution output is never written nor
// read back. Otherwise the two layers run one after the other. The
// results are the pool's either way, ties and NaNs included (the bias
// gradient is summed over the pooled gradient, so it may differ in the
// last bits).
type ConvMaxPool struct {
	Conv *Conv2D
	Pool *MaxPool2D

	fused bool
}

// NewConvMaxPool returns conv followed by pool; pool's input must be
// conv's output.
func NewConvMaxPool(conv *Conv2D, pool *MaxPool2D) *ConvMaxPool {
	g, p := conv.Geom, pool.Geom
	if p.C != conv.Out || p.H != g.OutH() || p.W != g.OutW() {
		panic(fmt.Sprintf("models: NewConvMaxPool: pool %+v does not take the convolution's output (%d, %d, %d)", p, conv.Out, g.OutH(), g.OutW()))
	}
	return &ConvMaxPool{Conv: conv, Pool: pool,
		fused: conv.wino && g.WinogradPoolOK() && p.K == 2 && p.Stride == 2}
}

// Forward returns the pool of the convolution of x.
func (l *ConvMaxPool) Forward(x []float32, batch int, train bool) []float32 {
	if l.fused {
		return l.Conv.poolForward(x, batch, l.Pool.ReLU)
	}
	return l.Pool.Forward(l.Conv.Forward(x, batch, train), batch, train)
}

// Backward back-propagates through the pool and the convolution.
func (l *ConvMaxPool) Backward(dy []float32) []float32 {
	if l.fused {
		return l.Conv.Backward(dy)
	}
	return l.Conv.Backward(l.Pool.Backward(dy))
}
