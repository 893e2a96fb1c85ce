package models

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gradsync/gradsync/internal/kernels"
)

// Conv2D is a 2-D convolution (cross-correlation, as torch.nn.Conv2d with
// groups 1 and dilation 1). 3×3 stride-1 kernels over at least
// winogradMinC channels run as Winograd F(2×2, 3×3) over blocks of
// samples (kernels.WinogradInput and friends: 2.25× fewer multiplications;
// F(4×4, 3×3) instead when winograd4 is set and the output sizes are
// multiples of 4);
// stride-1 kernels over few input channels (C·KH·KW ≤ 75, output rows of
// 8 or more, AVX2) as a direct convolution (kernels.ConvSmall); every other
// geometry runs per sample as im2col + GEMM.
// x is (batch, C, H, W) and y is (batch, Out, OutH, OutW), both row-major,
// with the geometry fixed at construction. W has PyTorch's layout
// (Out, C, KH, KW) and B is (Out), or nil for a convolution without bias.
type Conv2D struct {
	Geom kernels.ConvGeom
	Out  int
	// W, B are views into the network's flat parameter buffer; DW, DB are
	// the matching views into its gradient buffer. B and DB are nil when
	// the layer has no bias.
	W, B, DW, DB []float32
	// SkipInputGrad makes Backward skip dx (it returns nil), for the first
	// layer of a network.
	SkipInputGrad bool
	// ReLU fuses a following ReLU into the layer: y = max(0, conv(x)),
	// applied to each sample's output while it is in cache.
	ReLU bool
	// Chain runs the forward and input-gradient products of the im2col,
	// 1×1 and Winograd paths, and the Winograd weight gradient's dU, on
	// kernels.GemmChain instead of Gemm, in fp32 (the batch-norm
	// architectures set it where kernels.ChainOK). The im2col and 1×1
	// weight gradients (products with a transposed B) stay on Gemm. Each
	// output is then one multiply-add chain in a fixed order, so its value
	// does not depend on the columns computed beside it; the results
	// differ from Gemm's in the last bits.
	Chain bool

	x     []float32 // borrowed input of the last Forward
	batch int
	y, dx []float32 // owned, whole batch
	col   []float32 // owned: column matrices (C·KH·KW, OutH·OutW), one per sample when kept, else one
	kept  bool      // col holds every sample's column matrix from Forward
	// colsBatch: kept, and col holds them side by side as one (C·KH·KW,
	// batch·OutH·OutW) matrix (Chain, fp32, no fused ReLU), so that
	// Backward sums dW in one product over the batch
	colsBatch bool
	dcol      []float32 // owned scratch for Backward
	dmask     []float32 // owned scratch: one sample's dy masked by the fused ReLU
	dwt       []float32 // owned scratch: Σ_n col·dyᵀ, the weight gradient transposed (C·KH·KW, Out)
	gx, gy    []float32 // owned (wholeBatchChain): x gathered (C, batch·p), kept for Backward, and y gathered
	direct    bool      // 1×1 kernel, stride 1, no padding: the column matrix is the input itself

	small bool              // computed by kernels.ConvSmall (few input channels)
	cs    kernels.ConvSmall // its scratch

	wino  bool      // computed as Winograd F(2×2, 3×3), or F(4×4, 3×3) when wino4
	wino4 bool      // Winograd F(4×4, 3×3): 36 points instead of 16
	wu    []float32 // owned: transformed weights U (points, Out, C), set by Forward
	wdu   []float32 // owned scratch: their gradient dU
	wvt   []float32 // owned scratch: a block's V transposed (points, P, C), for dU's GEMMs
	wv    []float32 // owned: transformed inputs V, one block of 16 (F(4×4, 3×3): 36) matrices at stride sv per block of samples when kept, else one block
	wm    []float32 // owned scratch: one block's products M, or their gradients dM (one per point at stride sm)
	wdv   []float32 // owned scratch: one block's dV
	wt    []float32 // owned scratch: one block's 2×2 output tiles (4, Out, P)
	lp    lowp      // the GEMMs' precision (Network.SetPrecision)

	// The last Forward came from ConvMaxPool's fused path: y is the
	// pooled output (batch, Out, OutH/2, OutW/2), parg the window position
	// of each maximum, and the ReLU (l.ReLU or the pool's) applies to it.
	pooled     bool
	pooledReLU bool
	parg       []uint8
}

// winogradMinC is the fewest input channels for which the Winograd path is
// used: with fewer, its GEMMs are too thin to beat im2col.
const winogradMinC = 4

// winogradBlockTiles is the number of output tiles Winograd aims for per
// block of samples: a block's V and M (about 16·(C+Out)·tiles values)
// then stay in L2 between the transforms and the GEMMs. A variable so
// that tests can force one sample per block.
var winogradBlockTiles = 320

// winograd4 makes 3×3 stride-1 convolutions on the Winograd path whose
// output sizes are multiples of 4 use F(4×4, 3×3) (36 GEMMs over 4×4
// tiles, 1.78× fewer multiplications) instead of F(2×2, 3×3). Off: on
// the cnn's conv2 + pool (batch 64, one thread, thread CPU time) it
// measured 12.4–14.4 ms forward and 17.2–19.3 ms backward against
// 9.1–10.3 and 18.4–20.9 ms: its GEMMs take ~13 instead of ~16 ms (a
// block's V and M no longer fit in L2), and its pooled output transform
// and gradient, whose per-window work is Go code, ~12 instead of ~2 ms.
// Its float32 error passes the PyTorch parity tests but is too large for
// TestConvMaxPool's finite differences (step 1e-4) at 32 channels. It
// takes a build with -tags winograd4 (kernels.Winograd4Built) as well.
var winograd4 = false

// winograd4BlockTiles is winogradBlockTiles for F(4×4, 3×3) (8 of the
// cnn's samples; 4 and 2 measured no faster).
var winograd4BlockTiles = 288

// winogradKeepMax is keepColsMax for the Winograd path's V (a variable so
// that tests can force the recomputing path).
var winogradKeepMax = keepColsMax

// winoBlock returns the samples per Winograd block, the tiles per sample,
// and the point strides of V and M for a full block.
func (l *Conv2D) winoBlock() (nb, tiles, sv, sm int) {
	th, tw := l.Geom.WinogradTiles()
	bt := winogradBlockTiles
	if l.wino4 {
		th, tw = l.Geom.Winograd4Tiles()
		bt = winograd4BlockTiles
	}
	tiles = th * tw
	nb = max(1, bt/tiles)
	return nb, tiles, kernels.WinogradStride(l.Geom.C * nb * tiles), kernels.WinogradStride(l.Out * nb * tiles)
}

// keepColsMax is the largest batch of column matrices (in values) that
// Forward keeps for Backward; larger ones are recomputed per sample, which
// costs one more im2col but stays in cache.
const keepColsMax = 8 << 20

// NewConv2D returns a convolution over inputs of geometry g with out
// output channels, with or without a bias, and no parameter storage; bind
// its views (a Network does this) before use.
func NewConv2D(g kernels.ConvGeom, out int, bias bool) *Conv2D {
	if out < 1 || g.C < 1 || g.H < 1 || g.W < 1 || g.KH < 1 || g.KW < 1 || g.StrideH < 1 || g.StrideW < 1 ||
		g.PadH < 0 || g.PadW < 0 || g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
		panic(fmt.Sprintf("models: NewConv2D(%+v, %d): invalid geometry", g, out))
	}
	l := &Conv2D{Geom: g, Out: out}
	l.direct = g.KH == 1 && g.KW == 1 && g.StrideH == 1 && g.StrideW == 1 && g.PadH == 0 && g.PadW == 0
	l.wino = g.WinogradOK() && g.C >= winogradMinC
	l.wino4 = l.wino && winograd4 && kernels.Winograd4Built && g.OutH()%4 == 0 && g.OutW()%4 == 0
	l.small = !l.wino && !l.direct && kernels.SmallConvOK(g)
	if bias {
		l.B, l.DB = []float32{}, []float32{} // non-nil: bound later
	}
	return l
}

// OutSize is the number of output values per sample: Out·OutH·OutW.
func (l *Conv2D) OutSize() int { return l.Out * l.Geom.OutH() * l.Geom.OutW() }

// Init fills W (and B) from U(−1/√fan_in, 1/√fan_in), fan_in = C·KH·KW,
// PyTorch's default for nn.Conv2d, drawing the weight first.
func (l *Conv2D) Init(r *rand.Rand) {
	bound := 1 / math.Sqrt(float64(l.Geom.ColRows()))
	uniform(r, l.W, bound)
	uniform(r, l.B, bound)
}

// uniform fills dst from U(−bound, bound).
func uniform(r *rand.Rand, dst []float32, bound float64) {
	for i := range dst {
		dst[i] = float32((2*r.Float64() - 1) * bound)
	}
}

func (l *Conv2D) checkBound() {
	k := l.Geom.ColRows()
	if len(l.W) != l.Out*k || len(l.DW) != len(l.W) || len(l.DB) != len(l.B) || (l.B != nil && len(l.B) != l.Out) {
		panic(fmt.Sprintf("models: Conv2D(%d→%d): parameter views not bound (len W=%d B=%d DW=%d DB=%d)",
			l.Geom.C, l.Out, len(l.W), len(l.B), len(l.DW), len(l.DB)))
	}
}

// Forward computes y[n] = W·im2col(x[n]) + b for every sample.
func (l *Conv2D) Forward(x []float32, batch int, train bool) []float32 {
	l.checkBound()
	g := l.Geom
	in := g.C * g.H * g.W
	if batch < 1 || len(x) != batch*in {
		panic(fmt.Sprintf("models: Conv2D.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, g.C, g.H, g.W))
	}
	l.x, l.batch, l.pooled = x, batch, false
	k, p := g.ColRows(), g.ColCols()
	l.y = grow(l.y, batch*l.Out*p)
	if l.wino {
		l.winoForward(x, batch)
		return l.y
	}
	if l.small {
		l.kept = false
		l.cs.Forward(l.y, x, l.W, l.B, g, l.Out, batch, l.ReLU)
		return l.y
	}
	if l.wholeBatchChain() {
		// one product over the gathered batch: with GemmChain each
		// sample's outputs are those of its own product, bit for bit
		bp := batch * p
		l.gx = grow(l.gx, g.C*bp)
		l.gy = grow(l.gy, l.Out*bp)
		gatherPlanes(l.gx, x, batch, g.C, p)
		kernels.GemmChain(l.Out, bp, g.C, l.W, g.C, 1, l.gx, bp, false, l.gy, bp)
		scatterPlanes(l.y, l.gy, batch, l.Out, p)
		return l.y
	}
	l.kept = !l.direct && batch*k*p <= keepColsMax
	switch {
	case l.kept:
		l.col = grow(l.col, batch*k*p)
	case !l.direct:
		l.col = grow(l.col, k*p)
	}
	l.colsBatch = l.kept && l.Chain && l.lp.prec == FP32 && !l.ReLU
	if l.colsBatch {
		// GemmChain reads sample n's columns in place at row stride
		// batch·p: the same values as from a matrix of its own
		bp := batch * p
		for n := range batch {
			kernels.Im2colStrided(l.col[n*p:], bp, x[n*in:(n+1)*in], g)
			yn := l.y[n*l.Out*p : (n+1)*l.Out*p]
			var beta float32
			if l.B != nil {
				for f, b := range l.B {
					fill(yn[f*p:(f+1)*p], b)
				}
				beta = 1
			}
			l.prod(false, l.Out, p, k, l.W, k, l.col[n*p:], bp, beta, yn, p)
		}
		return l.y
	}
	for n := range batch {
		xn := x[n*in : (n+1)*in]
		yn := l.y[n*l.Out*p : (n+1)*l.Out*p]
		col := l.sampleCol(n, k*p)
		if col == nil {
			col = xn
		} else {
			kernels.Im2col(col, xn, g)
		}
		switch {
		case l.ReLU:
			// bias and ReLU in one pass over the output, while it is in cache
			l.prod(false, l.Out, p, k, l.W, k, col, p, 0, yn, p)
			for f := range l.Out {
				var b float32
				if l.B != nil {
					b = l.B[f]
				}
				row := yn[f*p : (f+1)*p]
				for i, v := range row {
					row[i] = max(v+b, 0)
				}
			}
		case l.B != nil:
			for f, b := range l.B {
				fill(yn[f*p:(f+1)*p], b)
			}
			l.prod(false, l.Out, p, k, l.W, k, col, p, 1, yn, p)
		default:
			l.prod(false, l.Out, p, k, l.W, k, col, p, 0, yn, p)
		}
	}
	return l.y
}

// sampleCol returns the column-matrix storage of sample n (kk values), or
// nil on the direct path.
func (l *Conv2D) sampleCol(n, kk int) []float32 {
	switch {
	case l.direct:
		return nil
	case l.kept:
		return l.col[n*kk : (n+1)*kk]
	default:
		return l.col[:kk]
	}
}

// prod is C = A·B (beta 0) or C += A·B (beta 1) with A (m×k) row-major
// at row stride lda, or its transpose stored (k×m) with transA, and B
// (k×n) row-major: on kernels.GemmChain when Chain is set and the layer
// computes in fp32, else l.lp.gemm.
func (l *Conv2D) prod(transA bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if l.Chain && l.lp.prec == FP32 {
		rsA, csA := lda, 1
		if transA {
			rsA, csA = 1, lda
		}
		kernels.GemmChain(m, n, k, a, rsA, csA, b, ldb, beta == 1, c, ldc)
		return
	}
	l.lp.gemm(transA, false, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
}

// fill sets every element of dst to v.
func fill(dst []float32, v float32) {
	if v == 0 {
		clear(dst)
		return
	}
	for i := range dst {
		dst[i] = v
	}
}

// Backward adds dW += Σ_n dy[n]·im2col(x[n])ᵀ and db += Σ dy, and returns
// dx = col2im(Wᵀ·dy[n]) per sample, or nil when SkipInputGrad is set.
// With ReLU set, dy is first masked where the output was 0. The column
// matrices come from Forward when the batch's fit in keepColsMax, and are
// recomputed per sample otherwise.
func (l *Conv2D) Backward(dy []float32) []float32 {
	g := l.Geom
	k, p := g.ColRows(), g.ColCols()
	if l.pooled {
		p /= 4
	}
	if l.x == nil || len(dy) != l.batch*l.Out*p {
		panic(fmt.Sprintf("models: Conv2D.Backward: len(dy)=%d, want batch %d × %d×%d×%d (after Forward)",
			len(dy), l.batch, l.Out, g.OutH(), g.OutW()))
	}
	in := g.C * g.H * g.W
	if l.wino {
		return l.winoBackward(dy)
	}
	if l.small {
		return l.smallBackward(dy)
	}
	if l.wholeBatch() {
		return l.wholeBatchBackward(dy)
	}
	if l.colsBatch {
		return l.colsBatchBackward(dy)
	}
	if !l.SkipInputGrad {
		l.dx = grow(l.dx, l.batch*in)
		if !l.direct {
			l.dcol = grow(l.dcol, k*p)
		}
	}
	if l.ReLU {
		l.dmask = grow(l.dmask, l.Out*p)
	}
	// The weight gradient is accumulated transposed, as col·dyᵀ: OpenBLAS
	// runs that product shape about 1.4× faster than dy·colᵀ here.
	l.dwt = grow(l.dwt, k*l.Out)
	clear(l.dwt)
	for n := range l.batch {
		xn := l.x[n*in : (n+1)*in]
		dyn := dy[n*l.Out*p : (n+1)*l.Out*p]
		if l.ReLU {
			reluMask(l.dmask, dyn, l.y[n*l.Out*p:(n+1)*l.Out*p])
			dyn = l.dmask
		}
		if l.DB != nil {
			for f := range l.Out {
				l.DB[f] += sum32(dyn[f*p : (f+1)*p])
			}
		}
		col := l.sampleCol(n, k*p)
		switch {
		case col == nil:
			col = xn
		case !l.kept:
			kernels.Im2col(col, xn, g)
		}
		l.lp.gemm(false, true, k, l.Out, p, 1, col, p, dyn, p, 1, l.dwt, l.Out)
		if l.SkipInputGrad {
			continue
		}
		dxn := l.dx[n*in : (n+1)*in]
		if l.direct {
			l.prod(true, k, p, l.Out, l.W, k, dyn, p, 0, dxn, p)
			continue
		}
		l.prod(true, k, p, l.Out, l.W, k, dyn, p, 0, l.dcol, p)
		clear(dxn)
		kernels.Col2im(dxn, l.dcol, g)
	}
	l.addDWT(k)
	if l.SkipInputGrad {
		return nil
	}
	return l.dx
}

// colsBatchBackward is Backward when Forward kept the column matrices side
// by side (colsBatch): dy gathered as (Out, batch·p) into dmask, dWᵀ =
// col·dyᵀ in one product over the batch (Gemm) and db from the gathered
// rows, then dx = col2im(Wᵀ·dy_n) per sample on GemmChain.
func (l *Conv2D) colsBatchBackward(dy []float32) []float32 {
	g := l.Geom
	k, p, in := g.ColRows(), g.ColCols(), g.C*g.H*g.W
	bp := l.batch * p
	l.dmask = grow(l.dmask, l.Out*bp)
	gatherPlanes(l.dmask, dy, l.batch, l.Out, p)
	if l.DB != nil {
		for f := range l.Out {
			l.DB[f] += sum32(l.dmask[f*bp : (f+1)*bp])
		}
	}
	l.dwt = grow(l.dwt, k*l.Out)
	l.lp.gemm(false, true, k, l.Out, bp, 1, l.col, bp, l.dmask, bp, 0, l.dwt, l.Out)
	l.addDWT(k)
	if l.SkipInputGrad {
		return nil
	}
	l.dx = grow(l.dx, l.batch*in)
	l.dcol = grow(l.dcol, k*p)
	for n := range l.batch {
		dxn := l.dx[n*in : (n+1)*in]
		l.prod(true, k, p, l.Out, l.W, k, dy[n*l.Out*p:(n+1)*l.Out*p], p, 0, l.dcol, p)
		clear(dxn)
		kernels.Col2im(dxn, l.dcol, g)
	}
	return l.dx
}

// addDWT adds dwt, the weight gradient accumulated transposed as (k,
// Out), into DW (Out, k).
func (l *Conv2D) addDWT(k int) {
	for f := range l.Out {
		dw := l.DW[f*k : (f+1)*k]
		for i := range dw {
			dw[i] += l.dwt[i*l.Out+f]
		}
	}
}

// wholeBatchMaxP is the largest output plane (OutH·OutW) for which a
// 1×1 stride-1 convolution sums its weight gradient with one GEMM over
// the whole batch instead of one per sample. Per sample, dWᵀ += x_n·dy_nᵀ
// is a thin product when p is small (MobileNet's 8×8, 4×4 and 2×2
// blocks, squeeze-and-excitation's 1×1): it reads and writes all of the
// (C, Out) gradient for a few columns, batch times over, and pays a BLAS
// call each. Gathering the batch's planes into (C, batch·p) and (Out,
// batch·p) matrices first costs a copy of x and dy, which is cheap next
// to that at these sizes. Forward and dx stay per sample: a sample's
// output must not depend on which other samples share its GEMM (one
// thread's batch against T threads' slices), or batch norm over a
// channel that is constant across the batch turns the rounding
// difference into a different output (its x − mean is rounding noise
// times 1/√eps).
var wholeBatchMaxP = 64

// wholeBatch reports whether the layer sums its weight gradient over the
// whole batch in one GEMM (wholeBatchMaxP, a variable so that tests can
// turn it off); a fused ReLU keeps the per-sample path.
func (l *Conv2D) wholeBatch() bool {
	return l.direct && !l.ReLU && l.Geom.ColCols() <= wholeBatchMaxP
}

// wholeBatchChain reports whether Forward and the input gradient of
// wholeBatchBackward run as one GemmChain product over the gathered batch
// (a 1×1 stride-1 convolution on small planes without bias or fused ReLU,
// with Chain in fp32): per sample, OpenBLAS's thin products and GemmChain
// with a plane of 16 or fewer columns waste most of each call or
// register.
func (l *Conv2D) wholeBatchChain() bool {
	return l.wholeBatch() && l.Chain && l.lp.prec == FP32 && l.B == nil && kernels.ChainOK()
}

// scatterPlanes is gatherPlanes' inverse: it sets dst (batch, rows, p)
// from src (rows, batch·p).
func scatterPlanes(dst, src []float32, batch, rows, p int) {
	for n := range batch {
		for r := range rows {
			copy(dst[(n*rows+r)*p:(n*rows+r+1)*p], src[(r*batch+n)*p:(r*batch+n+1)*p])
		}
	}
}

// gatherPlanes sets dst (rows, batch·p) to src (batch, rows, p): row r of
// dst holds plane r of every sample in turn.
func gatherPlanes(dst, src []float32, batch, rows, p int) {
	for n := range batch {
		for r := range rows {
			copy(dst[(r*batch+n)*p:(r*batch+n+1)*p], src[(n*rows+r)*p:(n*rows+r+1)*p])
		}
	}
}

// wholeBatchBackward is Backward's whole-batch path: dcol (or gx, on the
// wholeBatchChain path) holds x and dmask dy gathered as (C, batch·p) and
// (Out, batch·p); dW += dy·xᵀ (accumulated transposed, as on the
// per-sample path) in one GEMM and db += Σ dy; dx = Wᵀ·dy_n per sample,
// or for the gathered batch at once on the wholeBatchChain path.
func (l *Conv2D) wholeBatchBackward(dy []float32) []float32 {
	c, p := l.Geom.C, l.Geom.ColCols()
	bp := l.batch * p
	l.dmask = grow(l.dmask, l.Out*bp)
	gatherPlanes(l.dmask, dy, l.batch, l.Out, p)
	gx := l.gx // x gathered by Forward
	if !l.wholeBatchChain() {
		l.dcol = grow(l.dcol, c*bp)
		gatherPlanes(l.dcol, l.x, l.batch, c, p)
		gx = l.dcol
	}
	if l.DB != nil {
		for f := range l.Out {
			l.DB[f] += sum32(l.dmask[f*bp : (f+1)*bp])
		}
	}
	l.dwt = grow(l.dwt, c*l.Out)
	l.lp.gemm(false, true, c, l.Out, bp, 1, gx, bp, l.dmask, bp, 0, l.dwt, l.Out)
	l.addDWT(c)
	if l.SkipInputGrad {
		return nil
	}
	l.dx = grow(l.dx, l.batch*c*p)
	if l.wholeBatchChain() {
		// dx gathered = Wᵀ·dy gathered, then scattered
		l.dcol = grow(l.dcol, c*bp)
		kernels.GemmChain(c, bp, l.Out, l.W, 1, c, l.dmask, bp, false, l.dcol, bp)
		scatterPlanes(l.dx, l.dcol, l.batch, c, p)
		return l.dx
	}
	for n := range l.batch {
		l.prod(true, c, p, l.Out, l.W, c, dy[n*l.Out*p:(n+1)*l.Out*p], p, 0, l.dx[n*c*p:(n+1)*c*p], p)
	}
	return l.dx
}

// smallBackward is Backward on the kernels.ConvSmall path: dW and db in
// one pass over dy, then, unless SkipInputGrad, dx = col2im(Wᵀ·dy[n]) per
// sample as on the im2col path.
func (l *Conv2D) smallBackward(dy []float32) []float32 {
	g := l.Geom
	k, p, in := g.ColRows(), g.ColCols(), g.C*g.H*g.W
	l.cs.Grad(l.DW, l.DB, dy, l.x, g, l.Out, l.batch, l.ReLU)
	if l.SkipInputGrad {
		return nil
	}
	l.dx = grow(l.dx, l.batch*in)
	l.dcol = grow(l.dcol, k*p)
	if l.ReLU {
		l.dmask = grow(l.dmask, l.Out*p)
	}
	for n := range l.batch {
		dyn := dy[n*l.Out*p : (n+1)*l.Out*p]
		if l.ReLU {
			reluMask(l.dmask, dyn, l.y[n*l.Out*p:(n+1)*l.Out*p])
			dyn = l.dmask
		}
		dxn := l.dx[n*in : (n+1)*in]
		l.prod(true, k, p, l.Out, l.W, k, dyn, p, 0, l.dcol, p)
		clear(dxn)
		kernels.Col2im(dxn, l.dcol, g)
	}
	return l.dx
}

// sum32 returns Σ s accumulated in four float32 lanes (vectorisable, and
// closer to PyTorch's pairwise sums than one running float32 total).
func sum32(s []float32) float32 {
	var a0, a1, a2, a3 float32
	i := 0
	for ; i+4 <= len(s); i += 4 {
		a0 += s[i]
		a1 += s[i+1]
		a2 += s[i+2]
		a3 += s[i+3]
	}
	for ; i < len(s); i++ {
		a0 += s[i]
	}
	return (a0 + a1) + (a2 + a3)
}

// winoPoints is the number of Winograd points (and GEMMs per block): 16
// for F(2×2, 3×3), 36 for F(4×4, 3×3).
func (l *Conv2D) winoPoints() int {
	if l.wino4 {
		return kernels.Winograd4Points
	}
	return kernels.WinogradPoints
}

// winoForward is Forward on the Winograd path: per block of samples, the
// input transform, 16 GEMMs M[ξ] = U[ξ]·V[ξ] (36 for F(4×4, 3×3)) and
// the output transform with bias (and ReLU). V is kept for Backward when
// the batch's fit in keepColsMax.
func (l *Conv2D) winoForward(x []float32, batch int) {
	g := l.Geom
	in, out := g.C*g.H*g.W, l.OutSize()
	nb, tiles, sv, sm := l.winoBlock()
	blocks := (batch + nb - 1) / nb
	pts := l.winoPoints()
	l.kept = blocks*pts*sv <= winogradKeepMax
	l.wu = grow(l.wu, pts*l.Out*g.C)
	if l.wino4 {
		kernels.Winograd4Filter(l.wu, l.W, l.Out, g.C)
	} else {
		kernels.WinogradFilter(l.wu, l.W, l.Out, g.C)
	}
	if l.kept {
		l.wv = grow(l.wv, blocks*pts*sv)
	} else {
		l.wv = grow(l.wv, pts*sv)
	}
	l.wm = grow(l.wm, pts*sm)
	l.wt = grow(l.wt, 4*l.Out*nb*tiles)
	for blk := range blocks {
		n0 := blk * nb
		b := min(nb, batch-n0)
		P := b * tiles
		v := l.wv[:pts*sv]
		if l.kept {
			v = l.wv[blk*pts*sv : (blk+1)*pts*sv]
		}
		if l.wino4 {
			kernels.Winograd4Input(v, sv, x[n0*in:(n0+b)*in], g, b)
		} else {
			kernels.WinogradInput(v, sv, x[n0*in:(n0+b)*in], g, b)
		}
		for xi := range pts {
			l.prod(false, l.Out, P, g.C, l.wu[xi*l.Out*g.C:], g.C, v[xi*sv:], P, 0, l.wm[xi*sm:], P)
		}
		switch {
		case l.wino4 && l.pooled:
			po := out / 4
			kernels.Winograd4OutputPool(l.y[n0*po:(n0+b)*po], l.parg[n0*po:(n0+b)*po], l.wm, sm, l.B, g, l.Out, b, l.pooledReLU)
			continue
		case l.wino4:
			kernels.Winograd4Output(l.y[n0*out:(n0+b)*out], l.wm, sm, l.B, g, l.Out, b, l.ReLU)
			continue
		case l.pooled:
			po := out / 4
			kernels.WinogradOutputPool(l.y[n0*po:(n0+b)*po], l.parg[n0*po:(n0+b)*po], l.wt, l.wm, sm, l.B, g, l.Out, b, l.pooledReLU)
			continue
		}
		kernels.WinogradOutput(l.y[n0*out:(n0+b)*out], l.wt, l.wm, sm, l.B, g, l.Out, b, l.ReLU)
	}
}

// poolForward is Forward on the Winograd path with a 2×2 stride-2 max
// pool taken in the output transform (ConvMaxPool): it returns the pooled
// output (batch, Out, OutH/2, OutW/2), with max(0, ·) applied when relu
// or l.ReLU is set.
func (l *Conv2D) poolForward(x []float32, batch int, relu bool) []float32 {
	l.checkBound()
	g := l.Geom
	if !l.wino || !g.WinogradPoolOK() {
		panic(fmt.Sprintf("models: Conv2D.poolForward: %+v is not on the Winograd path with even output sizes", g))
	}
	in := g.C * g.H * g.W
	if batch < 1 || len(x) != batch*in {
		panic(fmt.Sprintf("models: Conv2D.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, g.C, g.H, g.W))
	}
	l.x, l.batch, l.pooled, l.pooledReLU = x, batch, true, relu || l.ReLU
	n := batch * l.OutSize() / 4
	l.y = grow(l.y, n)
	if cap(l.parg) < n {
		l.parg = make([]uint8, n)
	}
	l.parg = l.parg[:n]
	l.winoForward(x, batch)
	return l.y
}

// winoBackward is Backward on the Winograd path (F(2×2, 3×3) or
// F(4×4, 3×3)): per block, dM = A·dy·Aᵀ, dU[ξ] += dM[ξ]·V[ξ]ᵀ and, unless
// SkipInputGrad, dV[ξ] = U[ξ]ᵀ·dM[ξ] and dx = B·dV·Bᵀ scattered back;
// finally dW += Gᵀ·dU·G.
func (l *Conv2D) winoBackward(dy []float32) []float32 {
	g := l.Geom
	in, out, p := g.C*g.H*g.W, l.OutSize(), g.ColCols()
	nb, tiles, sv, sm := l.winoBlock()
	blocks := (l.batch + nb - 1) / nb
	pts := l.winoPoints()
	l.wdu = grow(l.wdu, pts*l.Out*g.C)
	clear(l.wdu)
	l.wvt = grow(l.wvt, pts*g.C*nb*tiles)
	if !l.SkipInputGrad {
		l.dx = grow(l.dx, l.batch*in)
		clear(l.dx)
		l.wdv = grow(l.wdv, pts*sv)
	}
	relu := l.ReLU
	if l.pooled {
		out, p, relu = out/4, p/4, l.pooledReLU
	}
	if relu && !l.pooled {
		l.dmask = grow(l.dmask, nb*out)
	}
	for blk := range blocks {
		n0 := blk * nb
		b := min(nb, l.batch-n0)
		P := b * tiles
		dyb := dy[n0*out : (n0+b)*out]
		if l.pooled {
			// the ReLU's gate and the bias gradient (reluMask's and sum32's
			// values) are taken in the output gradient transform
			var yb []float32
			if relu {
				yb = l.y[n0*out : (n0+b)*out]
			}
			if l.wino4 {
				kernels.Winograd4OutputPoolGrad(l.wm, sm, dyb, l.parg[n0*out:(n0+b)*out], yb, l.DB, g, l.Out, b)
			} else {
				kernels.WinogradOutputPoolGrad(l.wm, l.wt, sm, dyb, l.parg[n0*out:(n0+b)*out], yb, l.DB, g, l.Out, b)
			}
		} else {
			if relu {
				reluMask(l.dmask[:len(dyb)], dyb, l.y[n0*out:(n0+b)*out])
				dyb = l.dmask[:len(dyb)]
			}
			if l.DB != nil {
				for i := range b * l.Out {
					l.DB[i%l.Out] += sum32(dyb[i*p : (i+1)*p])
				}
			}
			if l.wino4 {
				kernels.Winograd4OutputGrad(l.wm, sm, dyb, g, l.Out, b)
			} else {
				kernels.WinogradOutputGrad(l.wm, l.wt, sm, dyb, g, l.Out, b)
			}
		}
		var v []float32
		switch {
		case l.kept:
			v = l.wv[blk*pts*sv : (blk+1)*pts*sv]
		case l.wino4:
			v = l.wv[:pts*sv]
			kernels.Winograd4Input(v, sv, l.x[n0*in:(n0+b)*in], g, b)
		default:
			v = l.wv[:pts*sv]
			kernels.WinogradInput(v, sv, l.x[n0*in:(n0+b)*in], g, b)
		}
		// dU[ξ] += dM[ξ]·V[ξ]ᵀ with Vᵀ copied out: a GEMM without a
		// transposed operand runs ~1.8× faster here, more than the copy costs
		kernels.WinogradTransposeVN(l.wvt, g.C*P, v, sv, g.C, P, pts)
		for xi := range pts {
			l.prod(false, l.Out, g.C, P, l.wm[xi*sm:], P, l.wvt[xi*g.C*P:], g.C, 1, l.wdu[xi*l.Out*g.C:], g.C)
		}
		if l.SkipInputGrad {
			continue
		}
		for xi := range pts {
			l.prod(true, g.C, P, l.Out, l.wu[xi*l.Out*g.C:], g.C, l.wm[xi*sm:], P, 0, l.wdv[xi*sv:], P)
		}
		if l.wino4 {
			kernels.Winograd4InputGrad(l.dx[n0*in:(n0+b)*in], l.wdv, sv, g, b)
		} else {
			kernels.WinogradInputGrad(l.dx[n0*in:(n0+b)*in], l.wdv, sv, g, b)
		}
	}
	if l.wino4 {
		kernels.Winograd4FilterGrad(l.DW, l.wdu, l.Out, g.C)
	} else {
		kernels.WinogradFilterGrad(l.DW, l.wdu, l.Out, g.C)
	}
	if l.SkipInputGrad {
		return nil
	}
	return l.dx
}
