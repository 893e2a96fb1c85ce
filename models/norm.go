package models

import (
	"fmt"
	"math"

	"github.com/gradsync/gradsync/internal/kernels"
)

// BatchNorm2d is torch.nn.BatchNorm2d(C) with eps 1e-5, momentum 0.1 and
// affine parameters. x and y are (batch, C, HW) for any plane size
// HW = H·W.
//
// In training mode each channel is normalised with the batch mean and
// biased variance over batch·HW values, and the running statistics move
// towards them: running = (1 − Momentum)·running + Momentum·stat, with the
// unbiased variance, as PyTorch does. In evaluation mode the running
// statistics are used. Weight (γ) and Bias (β) are parameters;
// RunningMean and RunningVar are buffers: views into the network's buffer
// storage, not into its gradient buffer.
type BatchNorm2d struct {
	C             int
	Eps, Momentum float32
	// ReLU fuses a following ReLU (marked Fused): y = max(0, x̂·γ + β),
	// taken on each plane while it is in cache, and Backward gates dy by
	// y > 0 plane by plane before its sums: the unfused pair's values bit
	// for bit, with one pass over memory fewer each way.
	ReLU           bool
	Weight, Bias   []float32 // (C) parameter views
	DWeight, DBias []float32 // (C) gradient views
	RunningMean    []float32 // (C) buffer view
	RunningVar     []float32 // (C) buffer view

	// group, when set, makes the threads' copies of this layer normalise
	// over the whole batch (SetThreads); thread is this copy's index.
	group  *bnGroup
	thread int

	batch, hw int
	train     bool
	// replay, set by the checkpointer for a recomputation, makes a
	// training Forward normalise with stats, the batch statistics of the
	// Forward it repeats, instead of computing them again (bit for bit
	// the same values, from the same input) and leaves the running
	// statistics alone; the threads' copies skip their group's barriers.
	replay bool
	stats  []float32 // owned (2C), not lent: mean, then 1/√(var+eps), of the last training Forward
	// xhat is the normalised input of the last Forward, kept only by
	// the threads' copies (backwardGroup); one thread recomputes it in
	// Backward from x, bit for bit, instead of writing and reading it
	// back (a pass over memory each way).
	xhat   []float32 // owned
	x      []float32 // borrowed input of the last Forward
	mean   []float32 // owned (C): the mean used by the last Forward
	invStd []float32 // owned (C): 1/√(var+eps) used by the last Forward
	y, dx  []float32 // owned
}

// NewBatchNorm2d returns a batch norm over c channels with PyTorch's
// defaults; bind its views before use.
func NewBatchNorm2d(c int) *BatchNorm2d {
	if c < 1 {
		panic(fmt.Sprintf("models: NewBatchNorm2d(%d): channels must be positive", c))
	}
	return &BatchNorm2d{C: c, Eps: 1e-5, Momentum: 0.1}
}

// Init sets γ = 1, β = 0, running mean 0 and running variance 1.
func (l *BatchNorm2d) Init() {
	fill(l.Weight, 1)
	fill(l.Bias, 0)
	fill(l.RunningMean, 0)
	fill(l.RunningVar, 1)
}

func (l *BatchNorm2d) checkBound() {
	for _, v := range [][]float32{l.Weight, l.Bias, l.DWeight, l.DBias, l.RunningMean, l.RunningVar} {
		if len(v) != l.C {
			panic(fmt.Sprintf("models: BatchNorm2d(%d): views not bound", l.C))
		}
	}
}

// Forward normalises x per channel.
func (l *BatchNorm2d) Forward(x []float32, batch int, train bool) []float32 {
	l.checkBound()
	if batch < 1 || len(x) == 0 || len(x)%(batch*l.C) != 0 {
		panic(fmt.Sprintf("models: BatchNorm2d.Forward: len(x)=%d is not batch %d × C %d × H·W", len(x), batch, l.C))
	}
	hw := len(x) / (batch * l.C)
	l.batch, l.hw, l.train, l.x = batch, hw, train, x
	l.y = grow(l.y, len(x))
	if l.group != nil {
		l.xhat = grow(l.xhat, len(x))
	}
	l.mean = grow(l.mean, l.C)
	l.invStd = grow(l.invStd, l.C)
	if train && l.replay {
		for c := range l.C {
			l.normalize(x, c, l.stats[c], l.stats[l.C+c])
		}
		return l.y
	}
	if train {
		l.stats = grow(l.stats, 2*l.C)
	}
	if l.group != nil && train {
		l.forwardGroup(x)
		return l.y
	}
	m := batch * hw
	for c := range l.C {
		var mean, inv float32
		if train {
			// Two passes in float64: mean, then the centred sum of
			// squares, each in kernels.Acc64's sixteen lanes.
			var s, sq kernels.Acc64
			for n := range batch {
				s.AddF32(x[(n*l.C+c)*hw : (n*l.C+c+1)*hw])
			}
			mu := s.Sum() / float64(m)
			for n := range batch {
				sq.AddSqDev(x[(n*l.C+c)*hw:(n*l.C+c+1)*hw], mu)
			}
			ss := sq.Sum()
			variance := ss / float64(m)
			mean = float32(mu)
			inv = float32(1 / math.Sqrt(variance+float64(l.Eps)))
			unbiased := variance
			if m > 1 {
				unbiased = ss / float64(m-1)
			}
			mo := l.Momentum
			l.RunningMean[c] = (1-mo)*l.RunningMean[c] + mo*mean
			l.RunningVar[c] = (1-mo)*l.RunningVar[c] + mo*float32(unbiased)
			l.stats[c], l.stats[l.C+c] = mean, inv
		} else {
			mean = l.RunningMean[c]
			inv = float32(1 / math.Sqrt(float64(l.RunningVar[c])+float64(l.Eps)))
		}
		l.normalize(x, c, mean, inv)
	}
	return l.y
}

// normalize writes channel c of x̂ = (x − mean)·inv and y = x̂·γ + β,
// recording inv; x is (batch, C, HW) as in the last Forward.
func (l *BatchNorm2d) normalize(x []float32, c int, mean, inv float32) {
	hw := l.hw
	l.mean[c], l.invStd[c] = mean, inv
	g, b := l.Weight[c], l.Bias[c]
	for n := range l.batch {
		off := (n*l.C + c) * hw
		var xh []float32
		if l.group != nil {
			xh = l.xhat[off : off+hw]
		}
		y := l.y[off : off+hw]
		kernels.BNNormalize(xh, y, x[off:off+hw], mean, inv, g, b)
		if l.ReLU {
			reluTo(y, y)
		}
	}
}

// gatedDy returns the plane of dy at [off, off+hw): dy itself, or with a
// fused ReLU, dy gated by y > 0 written to the same plane of dx (which
// Backward then overwrites in place with the input gradient).
func (l *BatchNorm2d) gatedDy(dy []float32, off int) []float32 {
	d := dy[off : off+l.hw]
	if !l.ReLU {
		return d
	}
	dx := l.dx[off : off+l.hw]
	reluMask(dx, d, l.y[off:off+l.hw])
	return dx
}

// Backward adds dγ += Σ dy·x̂ and dβ += Σ dy per channel and returns dx. In
// training mode dx accounts for the batch statistics' dependence on x:
// dx = γ·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)); in evaluation mode the
// statistics are constants and dx = γ·invstd·dy.
func (l *BatchNorm2d) Backward(dy []float32) []float32 {
	if l.batch == 0 || len(dy) != len(l.y) {
		panic(fmt.Sprintf("models: BatchNorm2d.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	hw, batch := l.hw, l.batch
	l.dx = grow(l.dx, len(dy))
	if l.group != nil {
		l.backwardGroup(dy)
		return l.dx
	}
	m := float64(batch * hw)
	for c := range l.C {
		var ady, adyx kernels.Acc64
		mean, inv := l.mean[c], l.invStd[c]
		for n := range batch {
			off := (n*l.C + c) * hw
			ady.AddDotNorm(&adyx, l.gatedDy(dy, off), l.x[off:off+hw], mean, inv)
		}
		sdy, sdyx := ady.Sum(), adyx.Sum()
		l.DWeight[c] += float32(sdyx)
		l.DBias[c] += float32(sdy)
		k := l.Weight[c] * l.invStd[c]
		var meanDy, meanDyx float32
		if l.train {
			meanDy, meanDyx = float32(sdy/m), float32(sdyx/m)
		}
		for n := range batch {
			off := (n*l.C + c) * hw
			d := dy[off : off+hw]
			if l.ReLU {
				d = l.dx[off : off+hw] // gated in the first pass
			}
			kernels.BNInputGradNorm(l.dx[off:off+hw], d, l.x[off:off+hw], mean, inv, k, meanDy, meanDyx)
		}
	}
	return l.dx
}

// LayerNorm is torch.nn.LayerNorm(D) with eps 1e-5: every row of D values
// of x (any number of rows, batch × tokens) is normalised to mean 0 and
// variance 1, then scaled by Weight and shifted by Bias, both (D).
type LayerNorm struct {
	D              int
	Eps            float32
	Weight, Bias   []float32 // (D) parameter views
	DWeight, DBias []float32 // (D) gradient views

	rows   int
	xhat   []float32 // owned (rows, D)
	invStd []float32 // owned (rows)
	y, dx  []float32 // owned
}

// NewLayerNorm returns a layer norm over the last d values; bind its views
// before use.
func NewLayerNorm(d int) *LayerNorm {
	if d < 1 {
		panic(fmt.Sprintf("models: NewLayerNorm(%d): size must be positive", d))
	}
	return &LayerNorm{D: d, Eps: 1e-5}
}

// Init sets the weight to 1 and the bias to 0, as PyTorch.
func (l *LayerNorm) Init() {
	fill(l.Weight, 1)
	fill(l.Bias, 0)
}

// Forward normalises each row of D values.
func (l *LayerNorm) Forward(x []float32, batch int, train bool) []float32 {
	if len(l.Weight) != l.D || len(l.Bias) != l.D || len(l.DWeight) != l.D || len(l.DBias) != l.D {
		panic(fmt.Sprintf("models: LayerNorm(%d): views not bound", l.D))
	}
	if batch < 1 || len(x)%l.D != 0 || len(x)%batch != 0 || len(x) == 0 {
		panic(fmt.Sprintf("models: LayerNorm.Forward: len(x)=%d is not batch %d × rows × D %d", len(x), batch, l.D))
	}
	l.rows = len(x) / l.D
	l.y = grow(l.y, len(x))
	l.xhat = grow(l.xhat, len(x))
	l.invStd = grow(l.invStd, l.rows)
	for r := range l.rows {
		row := x[r*l.D : (r+1)*l.D]
		var s float64
		for _, v := range row {
			s += float64(v)
		}
		mu := s / float64(l.D)
		var ss float64
		for _, v := range row {
			d := float64(v) - mu
			ss += d * d
		}
		inv := float32(1 / math.Sqrt(ss/float64(l.D)+float64(l.Eps)))
		mean := float32(mu)
		l.invStd[r] = inv
		xh := l.xhat[r*l.D : (r+1)*l.D]
		y := l.y[r*l.D : (r+1)*l.D]
		for i, v := range row {
			h := (v - mean) * inv
			xh[i] = h
			y[i] = h*l.Weight[i] + l.Bias[i]
		}
	}
	return l.y
}

// Backward adds dγ += Σ_rows dy·x̂ and dβ += Σ_rows dy and returns
// dx = invstd·(g − mean(g) − x̂·mean(g·x̂)) per row, with g = γ·dy.
func (l *LayerNorm) Backward(dy []float32) []float32 {
	if l.rows == 0 || len(dy) != len(l.y) {
		panic(fmt.Sprintf("models: LayerNorm.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	l.dx = grow(l.dx, len(dy))
	for r := range l.rows {
		d := dy[r*l.D : (r+1)*l.D]
		xh := l.xhat[r*l.D : (r+1)*l.D]
		var sg, sgx float32
		for i, v := range d {
			l.DWeight[i] += v * xh[i]
			l.DBias[i] += v
			g := v * l.Weight[i]
			sg += g
			sgx += g * xh[i]
		}
		inv := l.invStd[r]
		mg, mgx := sg/float32(l.D), sgx/float32(l.D)
		dx := l.dx[r*l.D : (r+1)*l.D]
		for i, v := range d {
			dx[i] = inv * (v*l.Weight[i] - mg - xh[i]*mgx)
		}
	}
	return l.dx
}
