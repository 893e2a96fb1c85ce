package aggregator

import (
	"fmt"
	"slices"
)

// Unbounded is the staleness bound of consistency async: no rank ever
// waits.
const Unbounded = -1

// AsyncShard is the parameter-server core of one shard for consistency
// async and bounded (stale synchronous parallel). Unlike SyncShard there
// is no barrier: each rank's gradient is applied as soon as the whole of
// it is in, scaled by 1/world (so world pushes move the parameters as far
// as one synchronous step at the same learning rate), and the rank reads
// the parameters as they are then (Hogwild-style, per shard).
//
// Clocks. Each rank's clock is the number of its steps whose gradient the
// shard has taken (its next step); the shard's Clock is the slowest
// unfinished rank's. With a bound s ≥ 0 a rank may read the parameters
// for step c only when c − Clock() ≤ s (Ready): at most s steps ahead of
// the slowest. A gradient's staleness is how far the Clock moved between
// the rank's read and its gradient's arrival; a gradient more than s
// steps stale is refused (counted, not applied; the rank's step is
// consumed). Reading only when Ready keeps every staleness ≤ s, so a
// refusal means a rank pushed on parameters it did not read for that
// step. The number of other ranks' gradients applied in between (the
// staleness in updates) is counted too.
//
// Like SyncShard it is a pure state machine: no goroutines, I/O, clock
// or locking; the caller serialises calls and waits (see Ready).
type AsyncShard struct {
	params  []float32
	world   int
	bound   int64
	opt     Optimizer
	skipBad bool

	buf       [][]float32 // by rank: its gradient being received, allocated on first use
	got       []int       // by rank: elements of it received
	next      []int64     // by rank: the step whose gradient it pushes next
	finished  []bool      // by rank: left the job; not counted in Clock
	readClock []int64     // by rank: Clock() at its last Read
	readVer   []int64     // by rank: Version() at its last Read
	version   int64
	stats     AsyncStats
}

// Receipt says what became of one rank's gradient.
type Receipt struct {
	// Applied: the gradient changed the parameters. Otherwise it was
	// refused as too stale (Refused) or skipped as non-finite.
	Applied, Refused bool
	// StaleSteps is Clock() at the gradient's arrival minus Clock() when
	// the rank read the parameters it was computed on; StaleUpdates the
	// gradients (of any rank) applied in between.
	StaleSteps, StaleUpdates int64
}

// AsyncStats are a shard's counters since it started.
type AsyncStats struct {
	Applied, Refused, Skipped int64
	// Sums and maxima of Receipt.StaleSteps and StaleUpdates over every
	// gradient taken (applied, refused or skipped).
	StaleStepsSum, StaleStepsMax     int64
	StaleUpdatesSum, StaleUpdatesMax int64
}

// NewAsyncShard takes ownership of params. bound is the staleness bound s
// (consistency bounded) or Unbounded (async). With skipNonFinite a
// gradient holding NaN or Inf is dropped (counted as skipped); otherwise
// Add returns ErrNonFinite.
func NewAsyncShard(params []float32, world int, opt Optimizer, bound int, skipNonFinite bool) *AsyncShard {
	if world < 1 || bound < Unbounded {
		panic(fmt.Sprintf("aggregator: NewAsyncShard(world %d, bound %d)", world, bound))
	}
	return &AsyncShard{
		params: params, world: world, bound: int64(bound), opt: opt, skipBad: skipNonFinite,
		buf: make([][]float32, world), got: make([]int, world), next: make([]int64, world),
		finished: make([]bool, world), readClock: make([]int64, world), readVer: make([]int64, world),
	}
}

// Params are the current parameters; callers must not write them.
func (s *AsyncShard) Params() []float32 { return s.params }

// Version is the number of gradients applied.
func (s *AsyncShard) Version() int64 { return s.version }

// Next is the step whose gradient rank pushes next.
func (s *AsyncShard) Next(rank int) int64 { return s.next[rank] }

// Stats returns the shard's counters.
func (s *AsyncShard) Stats() AsyncStats { return s.stats }

// Clock is the slowest unfinished rank's clock (when every rank has
// finished, the fastest's).
func (s *AsyncShard) Clock() int64 {
	c, any := int64(0), false
	for r, n := range s.next {
		if !s.finished[r] && (!any || n < c) {
			c, any = n, true
		}
	}
	if !any {
		return slices.Max(s.next)
	}
	return c
}

// Ready reports whether rank may read the parameters for its next step:
// always without a bound, else when it is at most bound steps ahead of
// Clock(). A caller whose rank is not Ready waits until another rank's
// gradient or Finish moves the Clock.
func (s *AsyncShard) Ready(rank int) bool {
	return s.bound < 0 || s.next[rank]-s.Clock() <= s.bound
}

// Laggards are the unfinished ranks at Clock(): those a waiting rank
// waits for.
func (s *AsyncShard) Laggards() []int {
	c := s.Clock()
	var out []int
	for r, n := range s.next {
		if !s.finished[r] && n == c {
			out = append(out, r)
		}
	}
	return out
}

// Read records that rank reads the current parameters for its next step
// and returns them (the shard's buffer: copy it before the next Add).
func (s *AsyncShard) Read(rank int) []float32 {
	s.readClock[rank], s.readVer[rank] = s.Clock(), s.version
	return s.params
}

// Finish marks rank as gone: it pushes nothing more and no longer holds
// back the Clock.
func (s *AsyncShard) Finish(rank int) { s.finished[rank] = true }

// Add accumulates the piece [off, off+n) of rank's gradient for step,
// which must be the rank's next step; decodeAdd adds the piece into dst
// as SyncShard.Add's does. Pieces of one rank arrive in order and cover
// the shard exactly. When the last piece is in, the gradient is applied
// (or refused, or skipped) and complete is true with the receipt.
func (s *AsyncShard) Add(rank int, step int64, off, n int, decodeAdd func(dst []float32) error) (rc Receipt, complete bool, err error) {
	switch {
	case rank < 0 || rank >= s.world:
		return rc, false, fmt.Errorf("aggregator: rank %d out of range [0,%d)", rank, s.world)
	case s.finished[rank]:
		return rc, false, fmt.Errorf("aggregator: rank %d sent a gradient after it finished", rank)
	case step < s.next[rank]:
		return rc, false, &StaleError{Got: step, Want: s.next[rank]}
	case step > s.next[rank]:
		return rc, false, fmt.Errorf("aggregator: rank %d sent a gradient for step %d, but its next step is %d", rank, step, s.next[rank])
	case off != s.got[rank]:
		return rc, false, fmt.Errorf("aggregator: rank %d piece at offset %d, want %d (pieces must arrive in order)", rank, off, s.got[rank])
	case n < 0 || off+n > len(s.params):
		return rc, false, fmt.Errorf("aggregator: rank %d piece [%d,%d) outside %d parameters", rank, off, off+n, len(s.params))
	}
	if s.buf[rank] == nil {
		s.buf[rank] = make([]float32, len(s.params))
	}
	g := s.buf[rank]
	if err := decodeAdd(g[off : off+n]); err != nil {
		return rc, false, err
	}
	s.got[rank] += n
	if s.got[rank] < len(s.params) {
		return rc, false, nil
	}
	defer clear(g)
	rc.StaleSteps = s.Clock() - s.readClock[rank]
	rc.StaleUpdates = s.version - s.readVer[rank]
	s.got[rank] = 0
	s.next[rank]++
	st := &s.stats
	st.StaleStepsSum += rc.StaleSteps
	st.StaleStepsMax = max(st.StaleStepsMax, rc.StaleSteps)
	st.StaleUpdatesSum += rc.StaleUpdates
	st.StaleUpdatesMax = max(st.StaleUpdatesMax, rc.StaleUpdates)
	if s.bound >= 0 && rc.StaleSteps > s.bound {
		rc.Refused = true
		st.Refused++
		return rc, true, nil
	}
	inv := 1 / float32(s.world)
	finite := true
	for i, v := range g {
		g[i] = v * inv
		if v-v != 0 {
			finite = false
		}
	}
	switch {
	case finite:
		s.opt.Step(s.params, g)
		s.version++
		st.Applied++
		rc.Applied = true
	case s.skipBad:
		st.Skipped++
	default:
		return rc, true, fmt.Errorf("%w: rank %d's gradient of step %d", ErrNonFinite, rank, step)
	}
	return rc, true, nil
}
