package tensorpar

import (
	"context"
	"fmt"
	"math"
)

// SpatialBatchNorm is one rank's part of a batch norm over images split
// into strips (models.BatchNorm2d's function, PyTorch's defaults: eps
// 1e-5, momentum 0.1): in training its statistics are the whole images',
// not the strip's, so each rank's partial sums are all-reduced over the
// spatial group. Input and output are this rank's rows, (batch, C, rows,
// W) for any rows.
//
// Communication per training step, all within the group: Forward does two
// Sum all-reduces of C values (the sums, then the centred sums of
// squares: the same two passes as models, across the strips), Backward
// one of 2C values (Σ dy and Σ dy·x̂). Evaluation Forward and Backward
// communicate nothing. NewSpatialBatchNorm does one Max all-reduce of 4
// values (the shape handshake).
//
// γ, β and the running statistics are replicated. The running statistics
// come out the same on every rank; Backward adds this rank's share of
// dγ and dβ (its rows' sums), and their sum over the group — a job's
// data-parallel all-reduce, as for SpatialConv's weight — is the whole
// layer's gradient.
type SpatialBatchNorm struct {
	C, Plane                int // channels, and H·W of a whole image
	Eps, Momentum           float32
	Weight, Bias            []float32 // (C), views into Params
	DWeight, DBias          []float32 // (C), views into Grads
	RunningMean, RunningVar []float32 // (C), owned

	g             Group
	params, grads []float32
	batch, hw     int // the last Forward's batch and this rank's rows·W
	train         bool
	sums          []float32 // owned (2C): all-reduce buffer
	invStd        []float32 // owned (C)
	xhat, y, dx   []float32 // owned
}

// NewSpatialBatchNorm returns rank g.Rank()'s part of a batch norm over c
// channels of images of plane = H·W values per channel, with γ = 1,
// β = 0, running mean 0 and variance 1. Every rank of g must pass the
// same sizes (one all-reduce checks so).
func NewSpatialBatchNorm(ctx context.Context, g Group, c, plane int) (*SpatialBatchNorm, error) {
	if c < 1 || plane < 1 || c > maxExact || plane > maxExact {
		return nil, fmt.Errorf("tensorpar: spatial batch norm sizes C %d, H·W %d: want each in [1, 2²⁴]", c, plane)
	}
	if err := agree(ctx, g, "spatial batch norm", []string{"C", "H·W"}, c, plane); err != nil {
		return nil, err
	}
	l := &SpatialBatchNorm{C: c, Plane: plane, Eps: 1e-5, Momentum: 0.1, g: g,
		params: make([]float32, 2*c), grads: make([]float32, 2*c),
		RunningMean: make([]float32, c), RunningVar: make([]float32, c)}
	l.Weight, l.Bias = l.params[:c], l.params[c:]
	l.DWeight, l.DBias = l.grads[:c], l.grads[c:]
	for i := range c {
		l.Weight[i], l.RunningVar[i] = 1, 1
	}
	return l, nil
}

// Params is this rank's flat parameter buffer: γ, then β.
func (l *SpatialBatchNorm) Params() []float32 { return l.params }

// Grads is this rank's flat gradient buffer, laid out as Params.
func (l *SpatialBatchNorm) Grads() []float32 { return l.grads }

// Forward normalises x (batch, C, rows, W), this rank's rows, per
// channel with the whole images' batch statistics in training and the
// running statistics otherwise; the result is owned, valid until the next
// Forward. All ranks must pass the same batch and train.
func (l *SpatialBatchNorm) Forward(ctx context.Context, x []float32, batch int, train bool) ([]float32, error) {
	l.batch = 0
	if batch < 1 || len(x) == 0 || len(x)%(batch*l.C) != 0 || batch > maxExact/l.Plane {
		return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Forward: len(x) = %d is not batch %d × C %d × rows·W (and batch·H·W ≤ 2²⁴)", len(x), batch, l.C)
	}
	hw := len(x) / (batch * l.C)
	if hw > l.Plane {
		return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Forward: %d values per channel, more than the image's %d", hw, l.Plane)
	}
	l.hw, l.train = hw, train
	l.y, l.xhat = grow(l.y, len(x)), grow(l.xhat, len(x))
	l.invStd = grow(l.invStd, l.C)
	l.sums = grow(l.sums, 2*l.C)
	c := l.C
	mean := l.sums[:c]
	if train {
		// Two passes, as models: the mean, then the centred sum of
		// squares, each summed in float64 here and over the group.
		m := float64(batch * l.Plane)
		for ch := range c {
			var s float64
			for n := range batch {
				for _, v := range x[(n*c+ch)*hw : (n*c+ch+1)*hw] {
					s += float64(v)
				}
			}
			mean[ch] = float32(s)
		}
		if err := l.g.AllReduce(ctx, mean, Sum); err != nil {
			return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Forward: %w", err)
		}
		ss := l.sums[c : 2*c]
		for ch := range c {
			mu := float64(mean[ch]) / m
			var q float64
			for n := range batch {
				for _, v := range x[(n*c+ch)*hw : (n*c+ch+1)*hw] {
					d := float64(v) - mu
					q += d * d
				}
			}
			ss[ch] = float32(q)
			mean[ch] = float32(mu)
		}
		if err := l.g.AllReduce(ctx, ss, Sum); err != nil {
			return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Forward: %w", err)
		}
		for ch := range c {
			variance := float64(ss[ch]) / m
			l.invStd[ch] = float32(1 / math.Sqrt(variance+float64(l.Eps)))
			unbiased := variance
			if m > 1 {
				unbiased = float64(ss[ch]) / (m - 1)
			}
			mo := l.Momentum
			l.RunningMean[ch] = (1-mo)*l.RunningMean[ch] + mo*mean[ch]
			l.RunningVar[ch] = (1-mo)*l.RunningVar[ch] + mo*float32(unbiased)
		}
	} else {
		for ch := range c {
			mean[ch] = l.RunningMean[ch]
			l.invStd[ch] = float32(1 / math.Sqrt(float64(l.RunningVar[ch])+float64(l.Eps)))
		}
	}
	for ch := range c {
		mu, inv, g, b := mean[ch], l.invStd[ch], l.Weight[ch], l.Bias[ch]
		for n := range batch {
			off := (n*c + ch) * hw
			xh, y := l.xhat[off:off+hw], l.y[off:off+hw]
			for i, v := range x[off : off+hw] {
				h := (v - mu) * inv
				xh[i] = h
				y[i] = h*g + b
			}
		}
	}
	l.batch = batch
	return l.y, nil
}

// Backward adds this rank's share of dγ (Σ dy·x̂) and dβ (Σ dy) and
// returns dx for its rows, owned and valid until the next Backward: in
// training γ·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)) with the means over
// the whole images, in evaluation γ·invstd·dy.
func (l *SpatialBatchNorm) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if l.batch == 0 {
		return nil, errNoSpatialForward
	}
	if len(dy) != len(l.y) {
		return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Backward: len(dy) = %d, want %d", len(dy), len(l.y))
	}
	c, hw, batch := l.C, l.hw, l.batch
	sdy, sdyx := l.sums[:c], l.sums[c:2*c]
	for ch := range c {
		var a, b float64
		for n := range batch {
			off := (n*c + ch) * hw
			xh := l.xhat[off : off+hw]
			for i, d := range dy[off : off+hw] {
				a += float64(d)
				b += float64(d) * float64(xh[i])
			}
		}
		sdy[ch], sdyx[ch] = float32(a), float32(b)
		l.DBias[ch] += sdy[ch]
		l.DWeight[ch] += sdyx[ch]
	}
	if l.train {
		if err := l.g.AllReduce(ctx, l.sums, Sum); err != nil {
			return nil, fmt.Errorf("tensorpar: SpatialBatchNorm.Backward: %w", err)
		}
	}
	l.dx = grow(l.dx, len(dy))
	m := float64(batch * l.Plane)
	for ch := range c {
		k := l.Weight[ch] * l.invStd[ch]
		var meanDy, meanDyx float32
		if l.train {
			meanDy, meanDyx = float32(float64(sdy[ch])/m), float32(float64(sdyx[ch])/m)
		}
		for n := range batch {
			off := (n*c + ch) * hw
			xh, dx := l.xhat[off:off+hw], l.dx[off:off+hw]
			for i, d := range dy[off : off+hw] {
				dx[i] = k * (d - meanDy - xh[i]*meanDyx)
			}
		}
	}
	return l.dx, nil
}
