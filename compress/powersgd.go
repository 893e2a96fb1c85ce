package compress

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models"
)

// PowerSGDConfig configures PowerSGD. The zero value is usable: rank 2,
// compression from step 0, min compression rate 2, error feedback and
// warm start on, epsilon 0.
type PowerSGDConfig struct {
	// Rank is the approximation rank r (PyTorch's
	// matrix_approximation_rank). 0 means DefaultPowerSGDRank. A matrix
	// uses min(rows, cols, Rank).
	Rank int
	// StartIter is the first step that is compressed; earlier steps use the
	// plain bucketed all-reduce (PyTorch's start_powerSGD_iter). Literal:
	// 0 compresses from the first step. (New maps the spec's 0 to
	// DefaultStartIter.)
	StartIter int64
	// MinCompressionRate: a rows×cols matrix is compressed only if
	// (rows+cols)·r·MinCompressionRate < rows·cols. 0 means
	// DefaultMinCompressionRate (2, as in PyTorch).
	MinCompressionRate float64
	// NoErrorFeedback turns error feedback off (PyTorch's
	// use_error_feedback=False).
	NoErrorFeedback bool
	// NoWarmStart draws a fresh random Q every step instead of reusing the
	// last one (PyTorch's warm_start=False).
	NoWarmStart bool
	// Epsilon is added to each column norm in the Gram-Schmidt
	// orthogonalisation (PyTorch's orthogonalization_epsilon, default 0).
	// With 0 a column of norm 0 is left as zeros.
	Epsilon float64
	// Seed seeds the random initial Q of every matrix; all ranks must use
	// the same one.
	Seed int64
}

// PowerSGD defaults. PyTorch defaults to rank 1 and start_powerSGD_iter
// 1000; gradsync's jobs are short, so New uses rank 2 and start_iter 10.
const (
	DefaultPowerSGDRank       = 2
	DefaultStartIter          = 10
	DefaultMinCompressionRate = 2
)

// matrix is one compressed segment viewed as rows×cols (a conv weight
// [out, in, kh, kw] as [out, in·kh·kw]) with approximation rank r. P is
// rows×r and Q cols×r, both row-major, at pOff and qOff in the batched P
// and Q buffers; its error-feedback residual is at eOff in err.
type matrix struct {
	seg              int // index in segs
	off              int // offset in the gradient
	rows, cols, rank int
	pOff, qOff, eOff int
}

// PowerSGD is the PowerSGD reducer of Vogels et al. (2019) with the state
// machine of PyTorch's powerSGD_hook; see the package documentation.
type PowerSGD struct {
	*base
	cfg   PowerSGDConfig // defaults resolved
	segs  []models.Segment
	total int
	plain *Plain // before StartIter

	psgdLayout

	// pu is the first all-reduce's buffer: every P, then every
	// uncompressed tensor. q is the second's: every Q.
	pu    []float32
	q     []float32 // the Q used to compute P: the last step's, or random
	qNext []float32 // the Q being computed; swapped with q on success
	qInit bool      // q holds the last step's Q (warm start)
	err   []float32 // residuals of the compressed matrices, concatenated
	work  []float32 // with error feedback: gradient + residual, like err

	acc  []float64 // scratch: one row of r accumulators
	acc2 []float64 // scratch: cols×r accumulators, and the r columns of P in orthogonalise
}

var (
	_ Reducer  = (*PowerSGD)(nil)
	_ Stateful = (*PowerSGD)(nil)
)

// NewPowerSGD returns a PowerSGD reducer for a gradient laid out as segs;
// the plain all-reduce it falls back to before cfg.StartIter uses buckets
// of bucketCapBytes (0: 25 MiB).
func NewPowerSGD(ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, cfg PowerSGDConfig) (*PowerSGD, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	total, err := checkSegments(segs)
	if err != nil {
		return nil, err
	}
	b := newBase(ring, opts)
	p := newPowerSGDCore(segs, total, cfg)
	p.base, p.plain = b, newPlain(b, segs, bucketCapBytes)
	return p, nil
}

// resolve replaces zero values by the defaults and checks the ranges.
func (cfg *PowerSGDConfig) resolve() error {
	if cfg.Rank == 0 {
		cfg.Rank = DefaultPowerSGDRank
	}
	if cfg.MinCompressionRate == 0 {
		cfg.MinCompressionRate = DefaultMinCompressionRate
	}
	switch {
	case cfg.Rank < 0:
		return fmt.Errorf("compress: powersgd rank %d: want ≥ 1 (0: default %d)", cfg.Rank, DefaultPowerSGDRank)
	case cfg.StartIter < 0:
		return fmt.Errorf("compress: powersgd start_iter %d: want ≥ 0", cfg.StartIter)
	case !(cfg.MinCompressionRate > 0) || math.IsInf(cfg.MinCompressionRate, 0):
		return fmt.Errorf("compress: powersgd min_compression_rate %v: want a finite value > 0 (0: default %d)", cfg.MinCompressionRate, DefaultMinCompressionRate)
	case !(cfg.Epsilon >= 0) || math.IsInf(cfg.Epsilon, 0):
		return fmt.Errorf("compress: powersgd epsilon %v: want a finite value ≥ 0", cfg.Epsilon)
	}
	return nil
}

// psgdLayout is which segments PowerSGD compresses and where their
// factors live: derived from the segments, the rank and the min
// compression rate alone, so that every party of a job (ring ranks, ps
// workers and their parameter server) derives the same.
type psgdLayout struct {
	mats           []matrix
	flat           []int // indices of the segments that are not compressed
	nP, nQ, nE, nU int   // lengths of the batched P, Q, residuals, uncompressed tensors
	maxScratch     int   // the largest cols·r or rows·r
}

func newPSGDLayout(segs []models.Segment, rank int, rate float64) psgdLayout {
	var l psgdLayout
	for i, s := range segs {
		rows, cols, ok := shouldCompress(s.Shape, rank, rate)
		if !ok {
			l.flat = append(l.flat, i)
			l.nU += s.Len
			continue
		}
		r := min(rows, cols, rank)
		l.mats = append(l.mats, matrix{seg: i, off: s.Offset, rows: rows, cols: cols, rank: r, pOff: l.nP, qOff: l.nQ, eOff: l.nE})
		l.nP += rows * r
		l.nQ += cols * r
		l.nE += s.Len
		l.maxScratch = max(l.maxScratch, cols*r, rows*r)
	}
	return l
}

// newPowerSGDCore builds the state of PowerSGD (cfg resolved and checked)
// without a ring: the buffers, the residuals and the warm-start Q.
func newPowerSGDCore(segs []models.Segment, total int, cfg PowerSGDConfig) *PowerSGD {
	p := &PowerSGD{cfg: cfg, segs: segs, total: total, psgdLayout: newPSGDLayout(segs, cfg.Rank, cfg.MinCompressionRate)}
	p.pu = make([]float32, p.nP+p.nU)
	p.q = make([]float32, p.nQ)
	p.qNext = make([]float32, p.nQ)
	if !cfg.NoErrorFeedback {
		p.err = make([]float32, p.nE)
		p.work = make([]float32, p.nE)
	}
	p.acc = make([]float64, cfg.Rank)
	p.acc2 = make([]float64, p.maxScratch)
	return p
}

// shouldCompress views a tensor of the given shape as a matrix
// [shape[0], product of the rest] and reports whether PowerSGD compresses
// it: never for tensors of fewer than two dimensions, otherwise when
// (rows+cols)·min(rows, cols, rank)·rate < rows·cols, as in PyTorch's
// _should_compress.
func shouldCompress(shape []int, rank int, rate float64) (rows, cols int, ok bool) {
	if len(shape) < 2 {
		return 0, 0, false
	}
	rows, cols = shape[0], 1
	for _, d := range shape[1:] {
		cols *= d
	}
	if rows == 0 || cols == 0 {
		return rows, cols, false
	}
	r := min(rows, cols, rank)
	return rows, cols, float64(rows+cols)*float64(r)*rate < float64(rows)*float64(cols)
}

// Compressed reports the names of the segments PowerSGD compresses, in
// buffer order.
func (p *PowerSGD) Compressed() []string {
	out := make([]string, len(p.mats))
	for i, m := range p.mats {
		out[i] = p.segs[m.seg].Name
	}
	return out
}

// MessageBytes is the size of the message one compressed step sends: P,
// Q and the uncompressed tensors, 4 bytes per element.
func (p *PowerSGD) MessageBytes() int64 { return 4 * int64(len(p.pu)+len(p.q)) }

// Reduce implements Reducer.
func (p *PowerSGD) Reduce(ctx context.Context, grads []float32, step int64) error {
	c, err := p.begin(grads, p.total, step)
	if err != nil {
		return err
	}
	raw := 4 * int64(len(grads))
	if before, err := c.beforeStart(ctx, p.plain, grads, step, p.cfg.StartIter); before {
		return err
	}
	ef := !p.cfg.NoErrorFeedback
	// delta is the matrix to compress: with error feedback, the gradient
	// plus the residual, built in work so that a failed call leaves the
	// residual untouched; otherwise the gradient itself.
	delta := func(m *matrix) []float32 {
		if ef {
			return p.work[m.eOff : m.eOff+m.rows*m.cols]
		}
		return grads[m.off : m.off+m.rows*m.cols]
	}
	if ef {
		for i := range p.mats {
			m := &p.mats[i]
			d := delta(m)
			copy(d, p.err[m.eOff:m.eOff+len(d)])
			add(d, grads[m.off:m.off+len(d)])
		}
	}
	if !p.qInit || p.cfg.NoWarmStart {
		for i := range p.mats {
			p.randomQ(&p.mats[i], step)
		}
	}
	for i := range p.mats {
		m := &p.mats[i]
		p.mulPQ(p.pu[m.pOff:m.pOff+m.rows*m.rank], delta(m), p.q[m.qOff:m.qOff+m.cols*m.rank], m)
	}
	u := p.pu[p.nP:]
	for _, i := range p.flat {
		s := p.segs[i]
		copy(u, grads[s.Offset:s.Offset+s.Len])
		u = u[s.Len:]
	}
	// One all-reduce carries every P and the uncompressed tensors. P is
	// summed, not averaged: only its column space matters.
	if err := c.allReduce(ctx, p.pu); err != nil {
		return err
	}
	u = p.pu[p.nP:]
	for _, i := range p.flat {
		s := p.segs[i]
		g := grads[s.Offset : s.Offset+s.Len]
		copy(g, u)
		scale(g, p.inv)
		u = u[s.Len:]
	}
	for i := range p.mats {
		m := &p.mats[i]
		pm := p.pu[m.pOff : m.pOff+m.rows*m.rank]
		orthogonalize(pm, m.rows, m.rank, p.cfg.Epsilon, p.acc2)
		p.mulQ(p.qNext[m.qOff:m.qOff+m.cols*m.rank], delta(m), pm, m)
	}
	// One all-reduce carries every Q, averaged: P·Qᵀ is then the
	// approximation of the average gradient.
	if err := c.allReduce(ctx, p.qNext); err != nil {
		return err
	}
	scale(p.qNext, p.inv)
	p.q, p.qNext = p.qNext, p.q
	p.qInit = true
	for i := range p.mats {
		m := &p.mats[i]
		g := grads[m.off : m.off+m.rows*m.cols]
		p.mulApprox(g, p.pu[m.pOff:m.pOff+m.rows*m.rank], p.q[m.qOff:m.qOff+m.cols*m.rank], m)
		if ef {
			// The residual is what this rank meant to apply minus what
			// was applied.
			e := p.err[m.eOff : m.eOff+len(g)]
			copy(e, delta(m))
			sub(e, g)
		}
	}
	c.done(raw, p.MessageBytes())
	return nil
}

// randomQ fills m's Q with standard normal values from a stream that is a
// pure function of the seed, the segment index and (without warm start)
// the step, so every rank draws the same Q, then orthogonalises it.
func (p *PowerSGD) randomQ(m *matrix, step int64) {
	stream := uint64(m.seg)
	if p.cfg.NoWarmStart {
		stream |= uint64(step+1) << 24
	}
	rng := rand.New(rand.NewPCG(uint64(p.cfg.Seed), stream))
	q := p.q[m.qOff : m.qOff+m.cols*m.rank]
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	orthogonalize(q, m.cols, m.rank, p.cfg.Epsilon, p.acc2)
}

// mulPQ sets dst (rows×r) = d (rows×cols) · q (cols×r). The three
// products run on the GEMM backend in float32, as PyTorch's hook does with
// torch.matmul; every rank computes them with the same backend on the same
// (all-reduced) P and Q, so the approximation stays bit-identical.
func (p *PowerSGD) mulPQ(dst, d, q []float32, m *matrix) {
	kernels.Gemm(false, false, m.rows, m.rank, m.cols, 1, d, m.cols, q, m.rank, 0, dst, m.rank)
}

// mulQ sets dst (cols×r) = dᵀ (cols×rows) · pm (rows×r).
func (p *PowerSGD) mulQ(dst, d, pm []float32, m *matrix) {
	kernels.Gemm(true, false, m.cols, m.rank, m.rows, 1, d, m.cols, pm, m.rank, 0, dst, m.rank)
}

// mulApprox sets g (rows×cols) = pm (rows×r) · qᵀ (r×cols).
func (p *PowerSGD) mulApprox(g, pm, q []float32, m *matrix) {
	kernels.Gemm(false, true, m.rows, m.cols, m.rank, 1, pm, m.rank, q, m.rank, 0, g, m.cols)
}

// orthogonalize makes the r columns of a (rows×r, row-major) orthonormal
// by modified Gram-Schmidt in float64, with one re-orthogonalisation pass
// ("twice is enough"), so that P Pᵀ is a projection to float32 accuracy
// even when a column is nearly dependent on the previous ones. Each column
// is divided by its norm plus eps; a column of norm 0 becomes zeros. scratch
// must hold rows·r values.
func orthogonalize(a []float32, rows, r int, eps float64, scratch []float64) {
	cols := scratch[:rows*r] // column-major copy: column k is cols[k*rows:(k+1)*rows]
	for i := range rows {
		for k := range r {
			cols[k*rows+i] = float64(a[i*r+k])
		}
	}
	for k := range r {
		ck := cols[k*rows : (k+1)*rows]
		for range 2 {
			for j := range k {
				cj := cols[j*rows : (j+1)*rows]
				var dot float64
				for i, v := range cj {
					dot += v * ck[i]
				}
				for i, v := range cj {
					ck[i] -= dot * v
				}
			}
		}
		var ss float64
		for _, v := range ck {
			ss += v * v
		}
		norm := math.Sqrt(ss) + eps
		if norm == 0 {
			clear(ck)
			continue
		}
		for i := range ck {
			ck[i] /= norm
		}
	}
	for i := range rows {
		for k := range r {
			a[i*r+k] = float32(cols[k*rows+i])
		}
	}
}

func add(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += v
	}
}

func sub(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] -= v
	}
}

// State implements Stateful: "powersgd.q.<name>" (cols×r, the warm-start Q,
// present once a compressed step has run) and "powersgd.error.<name>" (the
// segment's shape, with error feedback) for every compressed segment.
func (p *PowerSGD) State() map[string]models.Tensor {
	st := map[string]models.Tensor{}
	for i := range p.mats {
		m := &p.mats[i]
		s := p.segs[m.seg]
		if p.qInit && !p.cfg.NoWarmStart {
			st["powersgd.q."+s.Name] = f32([]int{m.cols, m.rank}, p.q[m.qOff:m.qOff+m.cols*m.rank])
		}
		if p.err != nil {
			st["powersgd.error."+s.Name] = f32(s.Shape, p.err[m.eOff:m.eOff+s.Len])
		}
	}
	return st
}

// SetState implements Stateful. The Q matrices must be all present or all
// absent (absent: drawn afresh at the next compressed step); a missing
// residual is zero.
func (p *PowerSGD) SetState(st map[string]models.Tensor) error {
	want := map[string][]int{}
	for i := range p.mats {
		m := &p.mats[i]
		s := p.segs[m.seg]
		if !p.cfg.NoWarmStart {
			want["powersgd.q."+s.Name] = []int{m.cols, m.rank}
		}
		if p.err != nil {
			want["powersgd.error."+s.Name] = s.Shape
		}
	}
	if err := checkStateNames(st, want); err != nil {
		return err
	}
	nq := 0
	for i := range p.mats {
		if _, ok := st["powersgd.q."+p.segs[p.mats[i].seg].Name]; ok {
			nq++
		}
	}
	if nq != 0 && nq != len(p.mats) {
		return fmt.Errorf("compress: SetState: %d of %d powersgd.q tensors present; want all or none", nq, len(p.mats))
	}
	q := make([]float32, len(p.q))
	e := make([]float32, len(p.err))
	for i := range p.mats {
		m := &p.mats[i]
		name := p.segs[m.seg].Name
		if t, ok := st["powersgd.q."+name]; ok {
			v, err := t.Float32s()
			if err != nil {
				return fmt.Errorf("compress: SetState: powersgd.q.%s: %w", name, err)
			}
			copy(q[m.qOff:], v)
		}
		if t, ok := st["powersgd.error."+name]; ok {
			v, err := t.Float32s()
			if err != nil {
				return fmt.Errorf("compress: SetState: powersgd.error.%s: %w", name, err)
			}
			copy(e[m.eOff:], v)
		}
	}
	copy(p.q, q)
	copy(p.err, e)
	p.qInit = nq > 0
	return nil
}

// FlatLen implements Stateful: Shared is every Q (concatenated as in
// State), Own the error-feedback residuals (0 without error feedback).
func (p *PowerSGD) FlatLen() (shared, own int) {
	if p.cfg.NoWarmStart {
		return 0, len(p.err)
	}
	return len(p.q), len(p.err)
}

// CopyState implements Stateful.
func (p *PowerSGD) CopyState(dst *Flat) {
	dst.SharedSet = p.qInit && !p.cfg.NoWarmStart
	if !p.cfg.NoWarmStart {
		copy(dst.Shared[:len(p.q)], p.q)
	}
	copy(dst.Own[:len(p.err)], p.err)
}

// RestoreState implements Stateful.
func (p *PowerSGD) RestoreState(src *Flat) error {
	var q []float32
	if !p.cfg.NoWarmStart {
		q = p.q
	}
	set, err := restoreFlat(src, q, p.err)
	if err != nil {
		return err
	}
	p.qInit = set
	return nil
}
