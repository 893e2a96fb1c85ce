package psstep

import (
	"fmt"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
)

// Shard is the shard's side of the arithmetic of a consistency-sync
// step: it sums the ranks' pushes (aggregator.SyncShard), turns
// PowerSGD's summed phases into the P it answers, the averaged Q and the
// averaged gradient (compress.PSReceiver), applies the update, and says
// what the shard answers each of the plan's exchanges. It is pure: no
// I/O, no goroutines, no clock, no locking (the caller serialises
// calls).
type Shard struct {
	core *aggregator.SyncShard
	recv *compress.PSReceiver
	grad []float32 // PowerSGD: the averaged gradient CombineQ forms
	p    []float32 // PowerSGD: the current step's P, once its phase 1 is summed
	q    []float32 // PowerSGD: the last step's averaged Q, once applied
}

// NewShard drives core (the shard's parameters and optimiser) with
// recv, the job's compression on the shard's side, built for the same
// length of parameters.
func NewShard(core *aggregator.SyncShard, recv *compress.PSReceiver) *Shard {
	return &Shard{core: core, recv: recv, grad: make([]float32, len(core.Params()))}
}

// Outcome is what a piece of a push completed.
type Outcome struct {
	// Combined: every rank's push of the phase is in and combined, so
	// the ranks waiting on the phase may go on.
	Combined bool
	// Applied: that phase was the step's last; its averaged gradient is
	// applied (or skipped as non-finite) and the shard is at the next
	// step.
	Applied bool
}

// Add adds the piece [off, off+n) of rank's push ph of step, whose
// values decodeAdd adds into dst. When it completes the phase, the
// phase is combined: phase 0, the sum averaged and applied; phase 1,
// P = orthogonalised ΣP_i (Answer(Factors)); phase 2, Q = ΣQ_i/n and the
// gradient P·Qᵀ and the averaged uncompressed tensors, applied. An
// error is the core's (a bad piece, a stale step, ErrNonFinite).
func (s *Shard) Add(rank int, step int64, ph compress.PSPhase, off, n int, decodeAdd func(dst []float32) error) (Outcome, error) {
	if ph.Phase == 0 {
		applied, err := s.core.Add(rank, step, off, n, decodeAdd)
		return Outcome{Combined: applied, Applied: applied}, err
	}
	sum, err := s.core.Sum(rank, step, ph.Total, off, n, decodeAdd)
	switch {
	case sum == nil:
		return Outcome{}, err
	case ph.Phase == 1:
		s.p = s.recv.CombineP(sum)
		return Outcome{Combined: true}, nil
	}
	s.q = s.recv.CombineQ(sum, s.grad)
	return Outcome{Combined: true, Applied: true}, s.core.Apply(s.grad)
}

// Answer returns the values the shard sends for ex, an exchange from
// the shard: the parameters after the step (Params), the P of the
// step's phase 1 (Factors) or the step's averaged Q (SharedQ). The
// slice is the shard's own, valid until the next Add.
func (s *Shard) Answer(ex Exchange) []float32 {
	switch ex.Kind {
	case Params:
		return s.core.Params()
	case Factors:
		return s.p
	case SharedQ:
		return s.q
	}
	panic(fmt.Sprintf("psstep: the shard answers no %v", ex))
}

// Rank is a rank's side of the arithmetic of its steps against one
// shard: what it pushes for each Push exchange (its gradient, or
// PowerSGD's Q_i from the P the shard answered), where the factors the
// shard answers go, and the compression state it moves to once the
// step is applied (compress.PSPusher). It is pure and not safe for
// concurrent use.
type Rank struct {
	push    *compress.PSPusher
	factors []float32 // the factors last answered (Factors or SharedQ)
	q       []float32 // SharedQ's factors of the step, nil before them
}

// NewRank drives push, the job's compression on the rank's side.
func NewRank(push *compress.PSPusher) *Rank { return &Rank{push: push} }

// Plan is the exchanges of step (see Plan), from the rank's pushes.
func (r *Rank) Plan(step int64) []Exchange { return Plan(step, r.push.Phases(step)) }

// Push sends the rank's push ex through send: the gradient grads (this
// shard's range of it) for phase 0 or 1, Q_i from the P last received
// for phase 2.
func (r *Rank) Push(ex Exchange, grads []float32, send compress.PSSender) error {
	if ex.Kind != Push {
		panic(fmt.Sprintf("psstep: the rank pushes no %v", ex))
	}
	if ex.Phase == 2 {
		return r.push.PushQ(ex.Step, r.factors, send)
	}
	r.q = nil
	return r.push.Push(ex.Step, grads, send)
}

// Factors returns where the factors the shard answers with ex (Factors
// or SharedQ) go: a buffer of the length the scheme gives them, which
// the caller fills before the next exchange.
func (r *Rank) Factors(ex Exchange) []float32 {
	if ex.Kind != Factors && ex.Kind != SharedQ {
		panic(fmt.Sprintf("psstep: %v carries no factors", ex))
	}
	n := r.push.FactorLen(ex.Phase)
	if cap(r.factors) < n {
		r.factors = make([]float32, n)
	}
	r.factors = r.factors[:n]
	if ex.Kind == SharedQ {
		r.q = r.factors
	}
	return r.factors
}

// Applied moves the rank's compression state past step once its
// exchanges are done (the state a checkpoint gathers is that after the
// step): with the averaged Q the shard answered (SharedQ), if the plan
// had one.
func (r *Rank) Applied(step int64) error {
	q := r.q
	r.q = nil
	return r.push.Applied(step, q)
}
