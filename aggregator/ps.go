package aggregator

import (
	"errors"
	"fmt"
	"slices"
)

// Optimizer applies one update to flat parameters given the averaged
// gradient (internal/optim's SGD is one).
type Optimizer interface {
	Step(params, grads []float32)
}

// ErrNonFinite is returned by SyncShard.Add when a step's averaged gradient
// holds NaN or Inf and the shard's policy is to fail.
var ErrNonFinite = errors.New("aggregator: gradient holds NaN or Inf")

// StaleError is a contribution for a step the shard has already passed.
type StaleError struct{ Got, Want int64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("aggregator: gradient for step %d, but the shard is at step %d", e.Got, e.Want)
}

// SyncShard is the synchronous parameter-server core for one job: it owns the
// parameters, sums one gradient per rank for the current step, and when every
// rank's gradient is in, averages them and applies the optimiser. It is a
// pure state machine: no goroutines, no I/O, no locking (the caller
// serialises calls).
type SyncShard struct {
	params   []float32
	sum      []float32
	world    int
	step     int64
	got      []int  // elements received from each rank this step
	complete []bool // ranks whose gradient for this step is in
	done     int    // number of true entries in complete
	opt      Optimizer
	skipBad  bool
	skipped  int64

	// A step is either one dense push (Add) or phases of messages the
	// caller combines (Sum, then Apply). phased marks the latter; msg is
	// the current phase's sum, of msgLen elements.
	phased bool
	msg    []float32
	msgLen int
}

// NewSyncShard takes ownership of params. world is the number of ranks that
// contribute each step. With skipNonFinite a step whose average holds NaN or
// Inf is dropped (counted by Skipped); otherwise Add returns ErrNonFinite.
func NewSyncShard(params []float32, world int, opt Optimizer, skipNonFinite bool) *SyncShard {
	if world < 1 {
		panic("aggregator: SyncShard world must be at least 1")
	}
	return &SyncShard{
		params: params, sum: make([]float32, len(params)), world: world,
		got: make([]int, world), complete: make([]bool, world), opt: opt, skipBad: skipNonFinite,
	}
}

// StartAt sets the step the shard collects next, for a job resumed from a
// checkpoint taken after step optimiser steps: the parameters (and the
// optimiser's state) given to NewSyncShard are then those after step
// steps. It must come before the first Add.
func (s *SyncShard) StartAt(step int64) {
	if step < 0 || s.step != 0 || slices.ContainsFunc(s.got, func(n int) bool { return n > 0 }) {
		panic(fmt.Sprintf("aggregator: SyncShard.StartAt(%d) at step %d, or after gradients arrived", step, s.step))
	}
	s.step = step
}

// Params are the current parameters; callers must not write them.
func (s *SyncShard) Params() []float32 { return s.params }

// Step is the step whose gradients the shard is collecting.
func (s *SyncShard) Step() int64 { return s.step }

// Complete reports, per rank, whether its gradient for the current step is
// in. The slice is the shard's own: read it, don't keep it.
func (s *SyncShard) Complete() []bool { return s.complete }

// Skipped counts steps dropped for non-finite gradients.
func (s *SyncShard) Skipped() int64 { return s.skipped }

// Add accumulates the piece data = grad[off:off+len(data)] of rank's gradient
// for step. Pieces of one rank must arrive in order and cover the whole
// gradient exactly. decode writes the piece into dst (adding it: dst[i] +=
// value) and reports a malformed piece. When the last rank's last piece
// arrives, the shard averages, applies the optimiser, advances Step and
// returns applied = true.
func (s *SyncShard) Add(rank int, step int64, off, n int, decodeAdd func(dst []float32) error) (applied bool, err error) {
	switch {
	case rank < 0 || rank >= s.world:
		return false, fmt.Errorf("aggregator: rank %d out of range [0,%d)", rank, s.world)
	case step < s.step:
		return false, &StaleError{Got: step, Want: s.step}
	case step > s.step:
		return false, fmt.Errorf("aggregator: gradient for step %d arrived while the shard is at step %d", step, s.step)
	case s.complete[rank]:
		return false, fmt.Errorf("aggregator: rank %d sent its gradient for step %d twice", rank, step)
	case s.phased:
		return false, fmt.Errorf("aggregator: rank %d sent a dense gradient for step %d, whose pushes are phased", rank, step)
	case off != s.got[rank]:
		return false, fmt.Errorf("aggregator: rank %d piece at offset %d, want %d (pieces must arrive in order)", rank, off, s.got[rank])
	case n < 0 || off+n > len(s.params):
		return false, fmt.Errorf("aggregator: rank %d piece [%d,%d) outside %d parameters", rank, off, off+n, len(s.params))
	}
	if err := decodeAdd(s.sum[off : off+n]); err != nil {
		return false, err
	}
	s.got[rank] += n
	if s.got[rank] < len(s.params) {
		return false, nil
	}
	s.complete[rank] = true
	s.done++
	if s.done < s.world {
		return false, nil
	}
	return true, s.apply()
}

func (s *SyncShard) apply() error {
	inv := 1 / float32(s.world)
	for i, v := range s.sum {
		s.sum[i] = v * inv
	}
	return s.step1()
}

// step1 applies s.sum, the averaged gradient, and advances the step.
func (s *SyncShard) step1() error {
	finite := true
	for _, v := range s.sum {
		if v-v != 0 {
			finite = false
			break
		}
	}
	var err error
	switch {
	case finite:
		s.opt.Step(s.params, s.sum)
	case s.skipBad:
		s.skipped++
	default:
		err = fmt.Errorf("%w at step %d", ErrNonFinite, s.step)
	}
	clear(s.sum)
	s.resetPhase()
	s.phased = false
	s.step++
	return err
}

func (s *SyncShard) resetPhase() {
	clear(s.got)
	clear(s.complete)
	s.done = 0
	s.msgLen = 0
}

// Sum accumulates the piece [off, off+n) of rank's message of msgLen
// elements for the current phase of step, for a step whose gradient the
// caller computes from phases of summed messages (PowerSGD's factors).
// decodeAdd adds the piece into dst as Add's does. Pieces of one rank must
// arrive in order and cover the message exactly; every rank's message of a
// phase has the same length. When the last rank's last piece arrives, Sum
// returns the sum over the ranks (the shard's buffer, valid until the next
// Sum or Apply) and starts the next phase; the caller then either sums
// another phase or calls Apply.
func (s *SyncShard) Sum(rank int, step int64, msgLen, off, n int, decodeAdd func(dst []float32) error) (sum []float32, err error) {
	switch {
	case rank < 0 || rank >= s.world:
		return nil, fmt.Errorf("aggregator: rank %d out of range [0,%d)", rank, s.world)
	case step < s.step:
		return nil, &StaleError{Got: step, Want: s.step}
	case step > s.step:
		return nil, fmt.Errorf("aggregator: message for step %d arrived while the shard is at step %d", step, s.step)
	case !s.phased && slices.ContainsFunc(s.got, func(n int) bool { return n > 0 }):
		return nil, fmt.Errorf("aggregator: rank %d sent a phased message for step %d, whose gradient is pushed dense", rank, step)
	case s.complete[rank]:
		return nil, fmt.Errorf("aggregator: rank %d sent its message of this phase of step %d twice", rank, step)
	case msgLen < 0 || s.msgLen != 0 && msgLen != s.msgLen:
		return nil, fmt.Errorf("aggregator: rank %d sent a message of %d elements; this phase's have %d", rank, msgLen, s.msgLen)
	case off != s.got[rank]:
		return nil, fmt.Errorf("aggregator: rank %d piece at offset %d, want %d (pieces must arrive in order)", rank, off, s.got[rank])
	case n < 0 || off+n > msgLen:
		return nil, fmt.Errorf("aggregator: rank %d piece [%d,%d) outside a message of %d elements", rank, off, off+n, msgLen)
	}
	if s.msgLen == 0 {
		s.phased = true
		s.msgLen = msgLen
		if cap(s.msg) < msgLen {
			s.msg = make([]float32, msgLen)
		}
		s.msg = s.msg[:msgLen]
		clear(s.msg)
	}
	if err := decodeAdd(s.msg[off : off+n]); err != nil {
		return nil, err
	}
	s.got[rank] += n
	if s.got[rank] < msgLen {
		return nil, nil
	}
	s.complete[rank] = true
	s.done++
	if s.done < s.world {
		return nil, nil
	}
	s.resetPhase()
	return s.msg, nil
}

// Apply applies grad, the averaged gradient of the current step that the
// caller combined from the sums of its phases (see Sum), and advances
// Step. It returns ErrNonFinite as Add does (or counts a skipped step).
// Apply must come after a phase's last Sum and before any piece of
// another phase.
func (s *SyncShard) Apply(grad []float32) error {
	if !s.phased || s.msgLen != 0 || len(grad) != len(s.sum) {
		panic(fmt.Sprintf("aggregator: SyncShard.Apply of %d values at step %d (phased %v, a phase in progress: %v)", len(grad), s.step, s.phased, s.msgLen != 0))
	}
	copy(s.sum, grad)
	return s.step1()
}
