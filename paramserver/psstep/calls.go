package psstep

import (
	"fmt"
	"math"

	"github.com/gradsync/gradsync/aggregator"
)

// A script's collective calls in mode ps (entrypoint jobs): the shards
// are summation servers, as BytePS's servers are. The script keeps its
// own parameters and optimiser; each of its collective calls (numbered
// 0, 1, 2, … by every rank, in the same order) goes to every shard with
// the shard's piece of the call's values (Call.Piece); the shard
// combines the ranks' pieces (Calls) and answers every rank the result.
// Call is the one description of a call on both sides, and the agent's
// Collective interface takes it too, so that the ring and the parameter
// server carry the same calls.

// CallKind is what a call asks for.
type CallKind uint8

const (
	// CallSum sums the ranks' values (an all-reduce).
	CallSum CallKind = iota + 1
	// CallBroadcast gives every rank the root's values, bit for bit.
	CallBroadcast
	// CallBarrier returns once every rank has called it.
	CallBarrier
	// CallLayout checks that every rank registered the same gradient
	// layout (Call.Layout).
	CallLayout
)

var callNames = [...]string{CallSum: "all-reduce", CallBroadcast: "broadcast", CallBarrier: "barrier", CallLayout: "register-layout"}

func (k CallKind) String() string {
	if int(k) < len(callNames) && callNames[k] != "" {
		return callNames[k]
	}
	return fmt.Sprintf("CallKind(%d)", uint8(k))
}

// Layout identifies a registered gradient layout: its values and a
// checksum of its tensors' names, shapes and dtypes.
type Layout struct {
	Elements int64
	Checksum uint32
}

// Call is one collective call of a script, as every rank makes it.
type Call struct {
	Seq  int64
	Kind CallKind
	// Len is the number of values (CallSum, CallBroadcast): the whole
	// call's on a rank, a shard's piece on a shard (Piece).
	Len  int
	Root int    // CallBroadcast
	Lay  Layout // CallLayout
}

func (c Call) String() string {
	switch c.Kind {
	case CallSum:
		return fmt.Sprintf("%v %d of %d values", c.Kind, c.Seq, c.Len)
	case CallBroadcast:
		return fmt.Sprintf("%v %d of %d values from rank %d", c.Kind, c.Seq, c.Len, c.Root)
	case CallLayout:
		return fmt.Sprintf("%v %d (%d values, checksum %08x)", c.Kind, c.Seq, c.Lay.Elements, c.Lay.Checksum)
	}
	return fmt.Sprintf("%v %d", c.Kind, c.Seq)
}

// Sends reports whether rank sends values with c: every rank its
// values of a sum, the root alone those of a broadcast.
func (c Call) Sends(rank int) bool {
	switch c.Kind {
	case CallSum:
		return c.Len > 0
	case CallBroadcast:
		return c.Len > 0 && rank == c.Root
	}
	return false
}

// Answered reports whether the result of c carries values.
func (c Call) Answered() bool { return (c.Kind == CallSum || c.Kind == CallBroadcast) && c.Len > 0 }

// Piece returns c as shard index of k sees it and the range of the
// call's values it covers: aggregator.Partition(c.Len, k)[index], empty
// when the call has fewer values than shards. Every shard gets every
// call, so the shards go through the calls in step.
func (c Call) Piece(index, k int) (Call, aggregator.Range) {
	r := aggregator.Partition(c.Len, k)[index]
	c.Len = r.Len()
	return c, r
}

// DisagreeError is a call that some rank made differently from the
// first rank to make it (another kind, length or root at the same
// number): the scripts do not make the same calls in the same order.
type DisagreeError struct {
	Rank, First int
	Got, Want   Call
}

func (e *DisagreeError) Error() string {
	if e.Got.Kind == CallLayout && e.Want.Kind == CallLayout {
		return fmt.Sprintf("rank %d registered another gradient layout than rank %d (%d values, checksum %08x, against %d values, checksum %08x: names, shapes or dtypes differ)",
			e.Rank, e.First, e.Got.Lay.Elements, e.Got.Lay.Checksum, e.Want.Lay.Elements, e.Want.Lay.Checksum)
	}
	return fmt.Sprintf("the ranks disagree about call %d: rank %d made %v, rank %d %v", e.Want.Seq, e.Rank, e.Got, e.First, e.Want)
}

// Calls is a summation shard's side of a script's calls: it takes every
// rank's call (Begin) and values (Add), one call at a time in number
// order, and combines them once every rank's are in: the sum, exactly
// (the sum starts from -0.0, the identity of IEEE addition, so that a
// value is never changed by adding it to nothing: 0.0 + -0.0 would be
// +0.0), or the root's values as they came. It is pure: no I/O, no
// goroutines, no clock, no locking (the caller serialises calls).
//
// A rank makes call s+1 only once it has its result of call s, so at
// most two calls are alive: the one collected and the last completed,
// whose result stays valid until the call after the current completes.
type Calls struct {
	world  int
	maxLen int
	seq    int64  // the call being collected
	call   Call   // the first rank's call seq (valid when first >= 0)
	first  int    // the rank that made it first; -1: none yet
	begun  []bool // ranks whose call seq is in
	got    []int  // values received from each rank
	done   int    // ranks complete
	cur    []float32
	result []float32 // the last completed call's result
	layout Layout    // the last layout every rank registered
}

// NewCalls returns the core of a shard for world ranks whose calls carry
// at most maxLen values, or the registered layout's size where that is
// larger (a script reduces its gradient buckets, ranges of the layout).
func NewCalls(world, maxLen int) *Calls {
	if world < 1 || maxLen < 0 {
		panic(fmt.Sprintf("psstep: NewCalls(%d, %d)", world, maxLen))
	}
	return &Calls{world: world, maxLen: maxLen, first: -1, begun: make([]bool, world), got: make([]int, world)}
}

// Seq is the number of the call being collected.
func (s *Calls) Seq() int64 { return s.seq }

// Layout is the last layout every rank registered (zero before one).
func (s *Calls) Layout() Layout { return s.layout }

// Missing lists the ranks whose part of the current call is not in.
func (s *Calls) Missing() []int {
	var out []int
	for r := range s.world {
		if !s.completeRank(r) {
			out = append(out, r)
		}
	}
	return out
}

func (s *Calls) completeRank(r int) bool {
	return s.begun[r] && (!s.call.Sends(r) || s.got[r] == s.call.Len)
}

// Begin takes rank's call c. It reports whether that completed the call
// (c carries no values from rank, and rank was the last); an error is a
// call out of turn, too large, or unlike the first rank's
// (*DisagreeError).
func (s *Calls) Begin(rank int, c Call) (completed bool, err error) {
	switch {
	case rank < 0 || rank >= s.world:
		return false, fmt.Errorf("rank %d out of range [0,%d)", rank, s.world)
	case c.Seq != s.seq:
		return false, fmt.Errorf("rank %d made call %d while the shard collects call %d (every rank numbers its calls 0, 1, 2, … and makes each once)", rank, c.Seq, s.seq)
	case s.begun[rank]:
		return false, fmt.Errorf("rank %d made call %d twice", rank, c.Seq)
	case c.Kind < CallSum || c.Kind > CallLayout:
		return false, fmt.Errorf("rank %d: call %d of unknown kind %d", rank, c.Seq, c.Kind)
	case c.Len < 0 || (c.Kind != CallSum && c.Kind != CallBroadcast && c.Len != 0):
		return false, fmt.Errorf("rank %d: %v with %d values", rank, c, c.Len)
	case c.Len > s.limit():
		return false, fmt.Errorf("rank %d: %v: at most %d values a call (the larger of a message's bound and the registered layout's size)", rank, c, s.limit())
	case c.Kind == CallBroadcast && (c.Root < 0 || c.Root >= s.world):
		return false, fmt.Errorf("rank %d: %v: root out of range [0,%d)", rank, c, s.world)
	case c.Kind == CallLayout && (c.Lay.Elements < 1 || c.Lay.Elements > 1<<40):
		return false, fmt.Errorf("rank %d: %v: a layout of %d values", rank, c, c.Lay.Elements)
	}
	if s.first < 0 {
		s.call, s.first = c, rank
		if c.Len > 0 {
			if cap(s.cur) < c.Len {
				s.cur = make([]float32, c.Len)
			}
			s.cur = s.cur[:c.Len]
			if c.Kind == CallSum {
				negZero := float32(math.Copysign(0, -1))
				for i := range s.cur {
					s.cur[i] = negZero
				}
			}
		} else {
			s.cur = s.cur[:0]
		}
	} else if !sameCall(c, s.call) {
		return false, &DisagreeError{Rank: rank, First: s.first, Got: c, Want: s.call}
	}
	s.begun[rank] = true
	if c.Sends(rank) {
		return false, nil
	}
	return s.rankDone(), nil
}

func sameCall(a, b Call) bool {
	return a.Kind == b.Kind && a.Len == b.Len && (a.Kind != CallBroadcast || a.Root == b.Root) && (a.Kind != CallLayout || a.Lay == b.Lay)
}

// limit is the most values a call may carry.
func (s *Calls) limit() int { return max(s.maxLen, int(min(s.layout.Elements, math.MaxInt32))) }

// Add takes the values [off, off+n) of rank's current call, in order;
// write puts them into dst (n values): adding them (add, a sum) or as
// they are (a broadcast's root). It reports whether that completed the
// call.
func (s *Calls) Add(rank int, off, n int, write func(dst []float32, add bool) error) (completed bool, err error) {
	switch {
	case rank < 0 || rank >= s.world:
		return false, fmt.Errorf("rank %d out of range [0,%d)", rank, s.world)
	case !s.begun[rank]:
		return false, fmt.Errorf("rank %d sent values before its call %d", rank, s.seq)
	case !s.call.Sends(rank):
		return false, fmt.Errorf("rank %d sent values with %v, which takes none from it", rank, s.call)
	case off != s.got[rank]:
		return false, fmt.Errorf("rank %d: values at %d, want %d (in order)", rank, off, s.got[rank])
	case n < 0 || off+n > s.call.Len:
		return false, fmt.Errorf("rank %d: values [%d,%d) outside %v", rank, off, off+n, s.call)
	}
	if err := write(s.cur[off:off+n], s.call.Kind == CallSum); err != nil {
		return false, err
	}
	s.got[rank] += n
	if s.got[rank] < s.call.Len {
		return false, nil
	}
	return s.rankDone(), nil
}

// rankDone counts a rank complete and, for the last, completes the call.
func (s *Calls) rankDone() bool {
	s.done++
	if s.done < s.world {
		return false
	}
	if s.call.Kind == CallLayout {
		s.layout = s.call.Lay
	}
	s.result, s.cur = s.cur, s.result
	s.seq++
	s.first, s.done = -1, 0
	clear(s.begun)
	clear(s.got)
	return true
}

// Result is the values of the last completed call: its sum, or the
// broadcast's root's (empty for a call without values). It is the
// shard's own buffer: valid until the call after the current one
// completes.
func (s *Calls) Result() []float32 { return s.result }
