package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models"
)

// Strips are the boundaries of F horizontal strips of an image of height
// H: strip r holds the rows [s[r], s[r+1]), s[0] = 0, s[F] = H, every
// strip non-empty.
type Strips []int

// EvenStrips splits h rows into f strips whose heights differ by at most
// one (Span).
func EvenStrips(h, f int) Strips {
	s := make(Strips, f+1)
	for r := range f {
		s[r+1] = (r + 1) * h / f
	}
	return s
}

// validate checks that s splits h rows into f non-empty strips.
func (s Strips) validate(h, f int) error {
	if len(s) != f+1 || s[0] != 0 || s[f] != h {
		return fmt.Errorf("tensorpar: strips %v do not split %d rows over %d spatial ranks (want %d boundaries from 0 to %d)", []int(s), h, f, f+1, h)
	}
	for r := range f {
		if s[r+1] <= s[r] {
			return fmt.Errorf("tensorpar: strip %d of %v is empty", r, []int(s))
		}
	}
	return nil
}

// HaloRows returns the input rows [lo, hi) that the output rows
// [outLo, outHi) of a convolution or pooling window read, in the
// unpadded input's coordinates (rows < 0 or ≥ H are padding): output row
// o reads the rows o·stride − pad + i·dilation for i in [0, k), so
//
//	lo = outLo·stride − pad,  hi = (outHi−1)·stride − pad + (k−1)·dilation + 1.
//
// A rank holding the input rows [a, b) needs a−lo rows from above
// and hi−b from below (where positive and inside the image): for stride
// 1, pad p and an output strip aligned with its input strip, p rows
// above and (k−1)·dilation − p below — (k−1)/2 each for a "same" odd
// kernel.
func HaloRows(k, stride, pad, dilation, outLo, outHi int) (lo, hi int) {
	return outLo*stride - pad, (outHi-1)*stride - pad + (k-1)*dilation + 1
}

// span is [lo, hi) ∩ [a, b), empty (hi = lo) when they do not meet.
func span(lo, hi, a, b int) (int, int) {
	lo, hi = max(lo, a), min(hi, b)
	return lo, max(lo, hi)
}

// Shard is a spatial rank's share of a layer whose windows move over
// rows: its input rows Lo..Hi−1 of the strips In, and its output rows
// OLo..OHi−1 of the strips OutS.
type Shard struct {
	In, OutS Strips
	Lo, Hi   int
	OLo, OHi int
}

// rowHalo is the halo machinery of a layer of windows of k rows moved by
// stride over pad-padded rows, sharded by strips: it gathers the rows a
// rank's windows read (padding as explicit zero rows) and sends their
// gradients back to the neighbours they came from.
type rowHalo struct {
	Shard
	halo                 Halo
	c, h, w              int    // channels, the whole image's rows, row width
	k, stride, pad       int    // the window's rows
	needLo, need         int    // the rows (padded coordinates) this rank's windows read
	fromAbove, fromBelow [2]int // rows [lo, hi) received from rank−1, rank+1
	toAbove, toBelow     [2]int // rows of this strip that rank−1, rank+1 read
	batch                int
	xl                   []float32 // owned: the rows read (batch, C, need, W)
	sendA, sendB         []float32 // owned: frames out in forward, in in backward
	recvA, recvB         []float32 // owned: frames in in forward, out in backward
	dx                   []float32 // owned (batch, C, Hi−Lo, W)
}

// needs returns the input rows [lo, hi) (padded coordinates) that rank
// q's output rows read.
func (l *rowHalo) needs(q int) (int, int) {
	return HaloRows(l.k, l.stride, l.pad, 1, l.OutS[q], l.OutS[q+1])
}

// newRowHalo sets up rank h.Rank()'s halo for a layer of the given
// window over (c, hgt, w) inputs with outH output rows, checks the
// strips (nil: even) and does the handshake: each rank sends both
// neighbours desc (the layer's description, strips appended here) and
// checks theirs, so that, the chain being connected, all ranks agree.
func newRowHalo(ctx context.Context, h Halo, what string, c, hgt, w, k, stride, pad, outH int, in, out Strips, desc []float32) (*rowHalo, error) {
	f, r := h.Size(), h.Rank()
	if in == nil {
		in = EvenStrips(hgt, f)
	}
	if out == nil {
		out = EvenStrips(outH, f)
	}
	if err := in.validate(hgt, f); err != nil {
		return nil, fmt.Errorf("%w (%s input)", err, what)
	}
	if err := out.validate(outH, f); err != nil {
		return nil, fmt.Errorf("%w (%s output)", err, what)
	}
	l := &rowHalo{Shard: Shard{In: in, OutS: out, Lo: in[r], Hi: in[r+1], OLo: out[r], OHi: out[r+1]},
		halo: h, c: c, h: hgt, w: w, k: k, stride: stride, pad: pad}
	// Every rank's reads must lie in its own strip and its neighbours'.
	for q := range f {
		lo, hi := l.needs(q)
		a, b := in[max(q-1, 0)], in[min(q+2, f)]
		if clo, chi := span(lo, hi, 0, hgt); clo < a || chi > b {
			return nil, fmt.Errorf("tensorpar: spatial %s: rank %d's output rows [%d, %d) read input rows [%d, %d), beyond its neighbours' strips [%d, %d): use fewer or taller strips",
				what, q, out[q], out[q+1], clo, chi, a, b)
		}
	}
	lo, hi := l.needs(r)
	l.needLo, l.need = lo, hi-lo
	if r > 0 {
		l.fromAbove[0], l.fromAbove[1] = span(lo, hi, in[r-1], in[r])
		al, ah := l.needs(r - 1)
		l.toAbove[0], l.toAbove[1] = span(al, ah, l.Lo, l.Hi)
	}
	if r < f-1 {
		l.fromBelow[0], l.fromBelow[1] = span(lo, hi, in[r+1], in[r+2])
		bl, bh := l.needs(r + 1)
		l.toBelow[0], l.toBelow[1] = span(bl, bh, l.Lo, l.Hi)
	}
	desc = append(desc, float32(f))
	for _, s := range []Strips{in, out} {
		for _, v := range s {
			desc = append(desc, float32(v))
		}
	}
	var above, below []float32
	if r > 0 {
		above = make([]float32, len(desc))
	}
	if r < f-1 {
		below = make([]float32, len(desc))
	}
	if err := h.Exchange(ctx, desc[:len(above)], desc[:len(below)], above, below); err != nil {
		return nil, fmt.Errorf("tensorpar: spatial %s handshake: %w", what, err)
	}
	for _, nb := range []struct {
		got  []float32
		rank int
	}{{above, r - 1}, {below, r + 1}} {
		for i := range nb.got {
			if nb.got[i] != desc[i] {
				return nil, fmt.Errorf("tensorpar: spatial rank %d's %s differs from its neighbour rank %d's (geometry, strips or parameters)", r, what, nb.rank)
			}
		}
	}
	return l, nil
}

// rows copies the rows [lo, hi) of a (batch, C, rows, W) tensor whose
// first row is row0 into dst, packed as (batch, C, hi−lo, W), when out; or
// adds dst's packed rows into them when !out.
func (l *rowHalo) rows(t []float32, row0, rows, lo, hi int, dst []float32, out bool) {
	w, k := l.w, (hi-lo)*l.w
	if k == 0 {
		return
	}
	i := 0
	for p := range l.batch * l.c {
		src := t[(p*rows+lo-row0)*w : (p*rows+hi-row0)*w]
		if out {
			copy(dst[i:i+k], src)
		} else {
			for j, v := range dst[i : i+k] {
				src[j] += v
			}
		}
		i += k
	}
}

// gather exchanges the halos of x (batch, C, Hi−Lo, W) and returns the
// rows this rank's windows read (batch, C, need, W): padding (zero), from
// above, own, from below, in row order; owned, valid until the next
// gather.
func (l *rowHalo) gather(ctx context.Context, x []float32, batch int) ([]float32, error) {
	l.batch = 0
	own, w := l.Hi-l.Lo, l.w
	if batch < 1 || len(x) != batch*l.c*own*w {
		return nil, fmt.Errorf("len(x) = %d, want batch %d × C %d × %d rows × W %d", len(x), batch, l.c, own, w)
	}
	l.batch = batch
	pc := batch * l.c
	l.sendA = grow(l.sendA, pc*(l.toAbove[1]-l.toAbove[0])*w)
	l.sendB = grow(l.sendB, pc*(l.toBelow[1]-l.toBelow[0])*w)
	l.recvA = grow(l.recvA, pc*(l.fromAbove[1]-l.fromAbove[0])*w)
	l.recvB = grow(l.recvB, pc*(l.fromBelow[1]-l.fromBelow[0])*w)
	l.rows(x, l.Lo, own, l.toAbove[0], l.toAbove[1], l.sendA, true)
	l.rows(x, l.Lo, own, l.toBelow[0], l.toBelow[1], l.sendB, true)
	if err := l.halo.Exchange(ctx, l.sendA, l.sendB, l.recvA, l.recvB); err != nil {
		l.batch = 0
		return nil, err
	}
	l.xl = grow(l.xl, pc*l.need*w)
	clear(l.xl)
	ol, oh := span(l.needLo, l.needLo+l.need, l.Lo, l.Hi)
	for p := range pc {
		dst := l.xl[p*l.need*w : (p+1)*l.need*w]
		if k := l.fromAbove[1] - l.fromAbove[0]; k > 0 {
			copy(dst[(l.fromAbove[0]-l.needLo)*w:], l.recvA[p*k*w:(p+1)*k*w])
		}
		if oh > ol {
			copy(dst[(ol-l.needLo)*w:(oh-l.needLo)*w], x[(p*own+ol-l.Lo)*w:(p*own+oh-l.Lo)*w])
		}
		if k := l.fromBelow[1] - l.fromBelow[0]; k > 0 {
			copy(dst[(l.fromBelow[0]-l.needLo)*w:], l.recvB[p*k*w:(p+1)*k*w])
		}
	}
	return l.xl, nil
}

// scatter takes the gradient of the rows read, dxl (batch, C, need, W),
// sends the neighbours' rows' parts back to them, and returns the
// gradient of this rank's rows (batch, C, Hi−Lo, W): its own part plus
// the parts the neighbours send back; owned, valid until the next
// scatter.
func (l *rowHalo) scatter(ctx context.Context, dxl []float32) ([]float32, error) {
	// The gradients of the rows read from the neighbours go back to them
	// in the buffers those rows came in; those of this rank's rows come
	// in in the buffers its rows went out.
	l.rows(dxl, l.needLo, l.need, l.fromAbove[0], l.fromAbove[1], l.recvA, true)
	l.rows(dxl, l.needLo, l.need, l.fromBelow[0], l.fromBelow[1], l.recvB, true)
	if err := l.halo.Exchange(ctx, l.recvA, l.recvB, l.sendA, l.sendB); err != nil {
		return nil, err
	}
	own, w := l.Hi-l.Lo, l.w
	l.dx = grow(l.dx, l.batch*l.c*own*w)
	clear(l.dx)
	ol, oh := span(l.needLo, l.needLo+l.need, l.Lo, l.Hi)
	if oh > ol {
		for p := range l.batch * l.c {
			copy(l.dx[(p*own+ol-l.Lo)*w:(p*own+oh-l.Lo)*w], dxl[(p*l.need+ol-l.needLo)*w:(p*l.need+oh-l.needLo)*w])
		}
	}
	l.rows(l.dx, l.Lo, own, l.toAbove[0], l.toAbove[1], l.sendA, false)
	l.rows(l.dx, l.Lo, own, l.toBelow[0], l.toBelow[1], l.sendB, false)
	return l.dx, nil
}

// errNoSpatialForward is Backward's error without a successful Forward.
var errNoSpatialForward = errors.New("tensorpar: spatial layer's Backward without a successful Forward")

// SpatialConv is one rank's part of a spatially sharded (DistConv,
// Dryden et al. 2019) 2-D convolution, models.Conv2D's function over an
// image whose rows are split into F strips: rank r holds the input rows
// In[r]..In[r+1]−1 of every sample and channel and computes the output
// rows OutS[r]..OutS[r+1]−1 (Strips; uneven allowed, EvenStrips by
// default). Before its convolution it receives the input rows its
// windows read from its neighbours' strips (the halo: HaloRows, with the
// kernel, stride, padding and dilation 1) and, in backward, sends them
// their gradients; rows a rank reads must lie in its own or its
// neighbours' strips (else NewSpatialConv refuses the strips), and every
// rank must compute at least one output row. The halo is the span of the
// rows read, from the first to the last: with a stride larger than the
// kernel it holds rows between windows that none reads.
//
// The weight W (Out, C, KH, KW) and bias B (Out) are replicated: Backward
// adds this rank's share of their gradients (the sum over its output
// rows), and the sum over the spatial group — which a job folds into its
// data-parallel gradient all-reduce, as DistConv does — is the whole
// layer's gradient.
//
// Communication per step, all with the strip neighbours: Forward does
// one Exchange, sending each neighbour the rows of this strip it reads
// and receiving the rows this rank reads from its strips; Backward one,
// the same rows' gradients the other way. For stride 1 and "same" padding
// ((k−1)/2 of an odd k) that is batch·C·W·(k−1)/2 values per interior
// side each way: (k−1)/2 rows per image per channel. NewSpatialConv does
// one Exchange of the layer's description (every rank must pass the same
// geometry and strips; a neighbour that differs is an error).
type SpatialConv struct {
	*rowHalo
	Geom          kernels.ConvGeom // the whole image's geometry
	Out           int
	W, B, DW, DB  []float32
	params, grads []float32
	conv          *models.Conv2D // over the rows this rank reads, with explicit zero rows for padding
}

// NewSpatialConv returns rank h.Rank()'s part of a convolution of
// geometry g (the whole image) with out output channels, with or without
// bias, its input split by in and its output by outStrips (nil: even
// strips). The parameters are zero; set them with SetParams.
func NewSpatialConv(ctx context.Context, h Halo, g kernels.ConvGeom, out int, bias bool, in, outStrips Strips) (*SpatialConv, error) {
	if out < 1 || g.C < 1 || g.H < 1 || g.W < 1 || g.KH < 1 || g.KW < 1 || g.StrideH < 1 || g.StrideW < 1 ||
		g.PadH < 0 || g.PadW < 0 || g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW || out > maxExact || g.C > maxExact || g.H > maxExact || g.W > maxExact {
		return nil, fmt.Errorf("tensorpar: spatial convolution: invalid geometry %+v with %d outputs", g, out)
	}
	desc := []float32{1, float32(g.C), float32(g.H), float32(g.W), float32(g.KH), float32(g.KW), float32(g.StrideH), float32(g.StrideW),
		float32(g.PadH), float32(g.PadW), float32(out), 0}
	if bias {
		desc[len(desc)-1] = 1
	}
	rh, err := newRowHalo(ctx, h, "convolution", g.C, g.H, g.W, g.KH, g.StrideH, g.PadH, g.OutH(), in, outStrips, desc)
	if err != nil {
		return nil, err
	}
	l := &SpatialConv{rowHalo: rh, Geom: g, Out: out}
	// The local convolution reads `need` explicit rows (padding rows
	// zero) with no vertical padding.
	lg := g
	lg.H, lg.PadH = rh.need, 0
	l.conv = models.NewConv2D(lg, out, bias)
	nw, nb := out*g.C*g.KH*g.KW, 0
	if bias {
		nb = out
	}
	l.params, l.grads = make([]float32, nw+nb), make([]float32, nw+nb)
	l.W, l.DW = l.params[:nw], l.grads[:nw]
	if bias {
		l.B, l.DB = l.params[nw:], l.grads[nw:]
	}
	l.conv.W, l.conv.B, l.conv.DW, l.conv.DB = l.W, l.B, l.DW, l.DB
	return l, nil
}

// Params is this rank's flat parameter buffer: the weight, then the bias.
func (l *SpatialConv) Params() []float32 { return l.params }

// Grads is this rank's flat gradient buffer, laid out as Params.
func (l *SpatialConv) Grads() []float32 { return l.grads }

// SetParams copies the whole layer's weight (Out, C, KH, KW) and bias
// (Out; nil without bias).
func (l *SpatialConv) SetParams(w, b []float32) error {
	if len(w) != len(l.W) || len(b) != len(l.B) {
		return fmt.Errorf("tensorpar: spatial convolution parameters have lengths %d, %d, want %d, %d", len(w), len(b), len(l.W), len(l.B))
	}
	copy(l.W, w)
	copy(l.B, b)
	return nil
}

// Forward returns this rank's output rows y (batch, Out, OHi−OLo, OutW)
// for its input rows x (batch, C, Hi−Lo, W); y is owned, valid until the
// next Forward. All ranks must pass the same batch (a rank that does not
// makes its neighbours refuse its frames).
func (l *SpatialConv) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	xl, err := l.gather(ctx, x, batch)
	if err != nil {
		return nil, fmt.Errorf("tensorpar: SpatialConv.Forward: %w", err)
	}
	return l.conv.Forward(xl, batch, true), nil
}

// Backward adds this rank's share of the parameter gradients for its
// output rows' dy (batch, Out, OHi−OLo, OutW) and returns the gradient of
// its input rows dx (batch, C, Hi−Lo, W), owned and valid until the next
// Backward: its own windows' part plus the parts its neighbours send
// back for the rows they read.
func (l *SpatialConv) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if l.batch == 0 {
		return nil, errNoSpatialForward
	}
	if want := l.batch * l.Out * (l.OHi - l.OLo) * l.Geom.OutW(); len(dy) != want {
		return nil, fmt.Errorf("tensorpar: SpatialConv.Backward: len(dy) = %d, want %d", len(dy), want)
	}
	dx, err := l.scatter(ctx, l.conv.Backward(dy))
	if err != nil {
		return nil, fmt.Errorf("tensorpar: SpatialConv.Backward: %w", err)
	}
	return dx, nil
}

// SpatialPool is one rank's part of a spatially sharded max or average
// pool, models.MaxPool2D's or models.AvgPool2D's function (no padding)
// over images split into strips as SpatialConv's, with the same halo
// exchange: a pool window of K rows moved by Stride reads the rows
// HaloRows(K, Stride, 0, 1, ·) of its output rows. For K = Stride (the
// usual 2×2 pool) windows do not overlap, and an output strip aligned
// with its input strip exchanges nothing: only misaligned strips (an odd
// strip height) exchange rows.
type SpatialPool struct {
	*rowHalo
	Geom models.PoolGeom // the whole image's geometry
	Max  bool            // max pool; otherwise average
	pool models.Layer
}

// NewSpatialPool returns rank h.Rank()'s part of a max (or average)
// pool of geometry g (the whole image), its input split by in and its
// output by outStrips (nil: even strips).
func NewSpatialPool(ctx context.Context, h Halo, g models.PoolGeom, maxPool bool, in, outStrips Strips) (*SpatialPool, error) {
	if g.C < 1 || g.H < 1 || g.W < 1 || g.K < 1 || g.Stride < 1 || g.K > g.H || g.K > g.W || g.C > maxExact || g.H > maxExact || g.W > maxExact {
		return nil, fmt.Errorf("tensorpar: spatial pool: invalid geometry %+v", g)
	}
	kind := float32(3)
	if maxPool {
		kind = 2
	}
	desc := []float32{kind, float32(g.C), float32(g.H), float32(g.W), float32(g.K), float32(g.Stride)}
	rh, err := newRowHalo(ctx, h, "pool", g.C, g.H, g.W, g.K, g.Stride, 0, g.OutH(), in, outStrips, desc)
	if err != nil {
		return nil, err
	}
	l := &SpatialPool{rowHalo: rh, Geom: g, Max: maxPool}
	lg := g
	lg.H = rh.need
	if maxPool {
		l.pool = models.NewMaxPool2D(lg)
	} else {
		l.pool = models.NewAvgPool2D(lg)
	}
	return l, nil
}

// Forward returns this rank's output rows (batch, C, OHi−OLo, OutW) for
// its input rows x (batch, C, Hi−Lo, W); owned, valid until the next
// Forward.
func (l *SpatialPool) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	xl, err := l.gather(ctx, x, batch)
	if err != nil {
		return nil, fmt.Errorf("tensorpar: SpatialPool.Forward: %w", err)
	}
	return l.pool.Forward(xl, batch, true), nil
}

// Backward returns the gradient of this rank's input rows (batch, C,
// Hi−Lo, W) for its output rows' dy, owned and valid until the next
// Backward.
func (l *SpatialPool) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if l.batch == 0 {
		return nil, errNoSpatialForward
	}
	if want := l.batch * l.Geom.C * (l.OHi - l.OLo) * l.Geom.OutW(); len(dy) != want {
		return nil, fmt.Errorf("tensorpar: SpatialPool.Backward: len(dy) = %d, want %d", len(dy), want)
	}
	dx, err := l.scatter(ctx, l.pool.Backward(dy))
	if err != nil {
		return nil, fmt.Errorf("tensorpar: SpatialPool.Backward: %w", err)
	}
	return dx, nil
}
