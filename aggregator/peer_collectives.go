package aggregator

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/gradsync/gradsync/internal/fsum"
)

// PhaseAbort marks the frame a rank sends, after its call failed because
// a rank is gone, to the peers it was talking to in that call: Chunk
// names the rank that is gone. A rank that receives it fails with a
// *PeerError naming that rank, and passes it on, so that every survivor
// of a peer-to-peer all-reduce fails naming the dead rank even when it
// never talked to it (only the peer algorithms send it).
const PhaseAbort uint32 = 2

// abortGrace bounds how long a failed call tries to tell its peers; a
// peer that is itself stuck or gone does not read the notice.
const abortGrace = time.Second

// stageBits: a peer algorithm's frame carries its algorithm in the top
// byte of Chunk and its stage below, so that ranks that disagree about
// the algorithm (or a ring frame met by a peer algorithm) are caught as
// ErrUnexpectedFrame.
const stageBits = 24

// AllReduceHalvingDoubling sums buf element-wise over all ranks of p, in
// place, by recursive halving (a reduce-scatter) then recursive doubling
// (an all-gather), as gloo's allreduce_halving_doubling and MPICH's
// Rabenseifner algorithm: 2·log2(p) messages per rank instead of the
// ring's 2(n−1), for about the same bytes.
//
// Schedule, with q the largest power of two ≤ n and e = n − q extra ranks:
//
//   - Fold: each even rank r < 2e sends its whole buffer to r+1, which adds
//     it (own + received) and takes part for both; r waits for the result.
//     The q remaining ranks get virtual ranks v: r/2 for odd r < 2e, r−e
//     beyond.
//   - The buffer is cut into q blocks (segment(len, q, b)). At halving step
//     s = 0 … log2 q − 1, with d = q >> (s+1), virtual ranks v and v^d split
//     their current block range: the one with bit d clear keeps the lower
//     half, the other the upper; each sends the half it gives away and adds
//     the half it receives into the half it keeps (own + received). Rank v
//     ends holding the complete sum of block v, computed there only.
//   - Doubling retraces the steps (d = 1, 2, …, q/2): partners swap their
//     ranges, copying what they receive.
//   - Unfold: odd r < 2e sends the result to r−1.
//
// Every element's sum is computed once, on one rank, and copied
// everywhere else, so results are bit-identical on all ranks; the
// summation order is a fixed tree given n (not the ring's order, so
// results may differ from AllReduce's in the last bits). Frames are
// pipelined sub-chunks of at most opt.MaxFrameElems elements, tagged as
// the ring's are (Chunk carries the algorithm and the stage).
func AllReduceHalvingDoubling(ctx context.Context, p Peers, buf []float32, step int64, opt Options) error {
	return runPeerAllReduce(ctx, p, AlgoHalvingDoubling, buf, step, opt)
}

// AllReduceTree sums buf element-wise over all ranks of p, in place, over
// a binary tree (rank r's parent is (r−1)/2, its children 2r+1 and 2r+2):
// a reduce to rank 0, frame by frame pipelined up the tree, then a
// broadcast from rank 0 pipelined down it. Each rank adds its children's
// partial sums to its own in order (own + left + right); the root's sum
// is copied to every rank, so results are bit-identical on all ranks.
// About 2·log2(n) message latencies plus one frame per level: the choice
// for small messages on larger worlds. It is a single tree, not NCCL's
// double binary tree, so its bandwidth is at best half the ring's.
func AllReduceTree(ctx context.Context, p Peers, buf []float32, step int64, opt Options) error {
	return runPeerAllReduce(ctx, p, AlgoTree, buf, step, opt)
}

// AllReduceWith runs the all-reduce algorithm a (AlgoRing,
// AlgoHalvingDoubling or AlgoTree; resolve AlgoAuto with a CostModel
// first) over p. All ranks must pass the same a (and len(buf), step and
// opt, as for AllReduce): frames of another algorithm carry another tag
// and are refused with ErrUnexpectedFrame, but ranks that disagree may
// also all wait for frames that never come, until their contexts end.
func AllReduceWith(ctx context.Context, p Peers, a Algorithm, buf []float32, step int64, opt Options) error {
	switch a {
	case AlgoRing:
		return AllReduce(ctx, PeerRing(p), buf, step, opt)
	case AlgoHalvingDoubling, AlgoTree:
		return runPeerAllReduce(ctx, p, a, buf, step, opt)
	}
	return fmt.Errorf("aggregator: AllReduceWith: algorithm %v is not runnable; want ring, halving_doubling or tree", a)
}

// PeersOf returns the ranks that rank talks to in algorithm a's
// all-reduce over n ranks, in increasing order: the pairs a PairPeers
// needs connected.
func PeersOf(a Algorithm, rank, n int) []int {
	var ps []int
	switch a {
	case AlgoRing:
		if n > 1 {
			ps = []int{mod(rank-1, n), mod(rank+1, n)}
		}
	case AlgoHalvingDoubling, AlgoTree:
		for _, op := range peerPlan(a, rank, n, n, n) {
			ps = append(ps, op.peer)
		}
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}

// peerOp is one step of a rank's plan: send [off, off+size) of the buffer
// to peer, or receive it from peer and add it (add) or copy it in.
type peerOp struct {
	send      bool
	add       bool
	peer      int
	phase     uint32
	stage     uint32
	off, size int
}

// peerPlan is rank's plan for algorithm a over n ranks and a buffer of
// length elements, in frames of at most frame elements: a pure function
// of its arguments, the same schedule on every rank.
func peerPlan(a Algorithm, rank, n, length, frame int) []peerOp {
	var plan []peerOp
	put := func(send bool, peer int, phase uint32, stage, off, size int, add bool) {
		for o, m := range subchunks(off, size, frame) {
			plan = append(plan, peerOp{send: send, add: add, peer: peer, phase: phase, stage: uint32(stage), off: o, size: m})
		}
	}
	switch a {
	case AlgoHalvingDoubling:
		q := 1 << (bits.Len(uint(n)) - 1)
		extra := n - q
		logq := bits.Len(uint(q)) - 1
		real := func(v int) int {
			if v < extra {
				return 2*v + 1
			}
			return v + extra
		}
		unfold := 1 + 2*logq
		v := rank - extra
		if rank < 2*extra {
			if rank%2 == 0 {
				put(true, rank+1, PhaseReduceScatter, 0, 0, length, false)
				put(false, rank+1, PhaseGather, unfold, 0, length, false)
				return plan
			}
			v = rank / 2
			put(false, rank-1, PhaseReduceScatter, 0, 0, length, true)
		}
		// blocks [a, b) of q as an element range.
		rng := func(a, b int) (off, size int) {
			oa, _ := segment(length, q, a)
			ob, _ := segment(length, q, b)
			return oa, ob - oa
		}
		lo, cnt := 0, q
		for s := range logq {
			d := q >> (s + 1)
			half := cnt / 2
			keep, give := lo, lo+half
			if v&d != 0 {
				keep, give = give, keep
			}
			o, m := rng(give, give+half)
			put(true, real(v^d), PhaseReduceScatter, 1+s, o, m, false)
			o, m = rng(keep, keep+half)
			put(false, real(v^d), PhaseReduceScatter, 1+s, o, m, true)
			lo, cnt = keep, half
		}
		for s := logq - 1; s >= 0; s-- {
			d := q >> (s + 1) // == cnt; lo has bit d set iff v does
			stage := 1 + logq + (logq - 1 - s)
			o, m := rng(lo, lo+d)
			put(true, real(v^d), PhaseGather, stage, o, m, false)
			o, m = rng(lo^d, lo^d+d)
			put(false, real(v^d), PhaseGather, stage, o, m, false)
			lo &^= d
		}
		if rank < 2*extra {
			put(true, rank-1, PhaseGather, unfold, 0, length, false)
		}
	case AlgoTree:
		var children []int
		for _, c := range []int{2*rank + 1, 2*rank + 2} {
			if c < n {
				children = append(children, c)
			}
		}
		parent := (rank - 1) / 2
		for o, m := range subchunks(0, length, frame) {
			for _, c := range children {
				put(false, c, PhaseReduceScatter, 0, o, m, true)
			}
			if rank != 0 {
				put(true, parent, PhaseReduceScatter, 0, o, m, false)
			}
		}
		for o, m := range subchunks(0, length, frame) {
			if rank != 0 {
				put(false, parent, PhaseGather, 1, o, m, false)
			}
			for _, c := range children {
				put(true, c, PhaseGather, 1, o, m, false)
			}
		}
	default:
		panic(fmt.Sprintf("aggregator: internal error: no peer plan for %v", a))
	}
	return plan
}

func runPeerAllReduce(ctx context.Context, p Peers, a Algorithm, buf []float32, step int64, opt Options) error {
	if err := opt.Validate(); err != nil {
		return err
	}
	rank, n := p.Rank(), p.Size()
	if n < 1 || rank < 0 || rank >= n {
		return fmt.Errorf("aggregator: peers report rank %d of size %d", rank, n)
	}
	if n == 1 || len(buf) == 0 {
		return nil
	}
	c := &peerCall{
		parent: ctx,
		peers:  p,
		algo:   a,
		rank:   rank,
		n:      n,
		hdr:    Frame{Generation: opt.Generation, Op: OpAllReduce, Step: step},
		plan:   peerPlan(a, rank, n, len(buf), opt.maxFrame()),
	}
	return c.wrap(c.run(buf))
}

// peerCall runs one peer-to-peer collective on one rank: the calling
// goroutine walks the plan, receiving and computing; one sender goroutine
// per peer, owned by the call, drains that peer's queue. Each queue holds
// every frame the call sends to that peer, so enqueueing never blocks and
// the receiver never waits on a send. No goroutine outlives run.
type peerCall struct {
	parent  context.Context
	peers   Peers
	algo    Algorithm
	rank, n int
	hdr     Frame // Generation, Op and Step of every frame
	plan    []peerOp

	mu      sync.Mutex
	sendErr error // the first error of a sender; guarded by mu

	abortFrom int // the peer whose abort notice failed the call; -1 if none. Only run touches it.
}

func (c *peerCall) run(buf []float32) error {
	c.abortFrom = -1
	ctx, cancel := context.WithCancel(c.parent)
	defer cancel()
	counts := make(map[int]int)
	for _, op := range c.plan {
		if op.send {
			counts[op.peer]++
		}
	}
	queues := make(map[int]chan Frame, len(counts))
	var wg sync.WaitGroup
	for peer, k := range counts {
		q := make(chan Frame, k)
		queues[peer] = q
		wg.Go(func() {
			for f := range q {
				if err := c.peers.Send(ctx, peer, f); err != nil {
					c.mu.Lock()
					if c.sendErr == nil {
						c.sendErr = err
					}
					c.mu.Unlock()
					cancel() // unblock the receiver and the other senders
					return
				}
			}
		})
	}
	err := c.walk(ctx, buf, queues)
	for _, q := range queues {
		close(q)
	}
	if err != nil {
		cancel()
	}
	wg.Wait()
	c.mu.Lock()
	sendErr := c.sendErr
	c.mu.Unlock()
	if sendErr != nil && (err == nil || c.parent.Err() == nil && errors.Is(err, context.Canceled)) {
		err = sendErr // the receiver stopped because a sender failed
	}
	if pe := new(PeerError); errors.As(err, &pe) {
		c.abort(pe.Rank)
	}
	return err
}

// walk runs the plan; the data of a queued frame aliases buf. As in the
// ring's pipe, the plan never writes a range again before the frame that
// carries it has been handed to Send: a later write is a received final
// value that depends on this rank's contribution having arrived.
func (c *peerCall) walk(ctx context.Context, buf []float32, queues map[int]chan Frame) error {
	for _, op := range c.plan {
		want := c.hdr
		want.Phase, want.Chunk, want.Offset = op.phase, uint32(c.algo)<<stageBits|op.stage, op.off
		dst := buf[op.off : op.off+op.size]
		if op.send {
			want.Data = dst
			select {
			case queues[op.peer] <- want:
			default:
				panic("aggregator: internal error: peer send queue sized too small")
			}
			continue
		}
		f, err := c.peers.Recv(ctx, op.peer)
		if err != nil {
			return err
		}
		if err := c.check(f, op.peer, want, op.size); err != nil {
			return err
		}
		if op.add {
			fsum.Add(dst, f.Data)
		} else {
			copy(dst, f.Data)
		}
	}
	return nil
}

// check reports an error unless f, received from peer, has the tags of
// want and size values: a *PeerError for an abort notice of this call,
// ErrUnexpectedFrame for anything else.
func (c *peerCall) check(f Frame, from int, want Frame, size int) error {
	if f.Phase == PhaseAbort && f.Generation == want.Generation && f.Op == want.Op && f.Step == want.Step && len(f.Data) == 0 {
		c.abortFrom = from
		return &PeerError{Rank: int(f.Chunk), Err: fmt.Errorf("%w (reported by rank %d)", ErrPeerGone, from)}
	}
	if f.Generation != want.Generation || f.Op != want.Op || f.Step != want.Step ||
		f.Phase != want.Phase || f.Chunk != want.Chunk || f.Offset != want.Offset || len(f.Data) != size {
		return fmt.Errorf("%w from rank %d: got %s, want %s",
			ErrUnexpectedFrame, from, tags(f, len(f.Data)), tags(want, size))
	}
	return nil
}

// abort tells every peer of the plan except dead (and the peer that told
// this rank) that dead is gone, each in a goroutine of its own, and waits
// for them at most abortGrace.
func (c *peerCall) abort(dead int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.parent), abortGrace)
	defer cancel()
	f := c.hdr
	f.Phase, f.Chunk = PhaseAbort, uint32(dead)
	var wg sync.WaitGroup
	seen := map[int]bool{dead: true, c.abortFrom: true}
	for _, op := range c.plan {
		if seen[op.peer] {
			continue
		}
		seen[op.peer] = true
		wg.Go(func() { _ = c.peers.Send(ctx, op.peer, f) }) // best effort: the peer may be gone too
	}
	wg.Wait()
}

func (c *peerCall) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("aggregator: %v %v rank %d/%d step %d: %w", c.algo, c.hdr.Op, c.rank, c.n, c.hdr.Step, err)
}
