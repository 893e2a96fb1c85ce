package tensorpar

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/gradsync/gradsync/aggregator"
)

// ReduceOp is the element-wise combination of an all-reduce.
type ReduceOp uint8

// Reductions.
const (
	Sum ReduceOp = iota + 1
	Max
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduceop(%d)", uint8(o))
}

// Group is the collective interface of one model-parallel group. All ranks
// of the group call the same operations in the same order with the same
// lengths. Every call takes a context; implementations return promptly
// once it is done.
type Group interface {
	Rank() int
	Size() int
	// AllReduce combines buf element-wise over the group, in place; every
	// rank ends with the same values.
	AllReduce(ctx context.Context, buf []float32, op ReduceOp) error
	// AllGather concatenates every rank's src into dst in rank order
	// (len(dst) = Size()·len(src)).
	AllGather(ctx context.Context, dst, src []float32) error
	// Broadcast copies rank root's buf into buf on every other rank.
	Broadcast(ctx context.Context, buf []float32, root int) error
}

// RingGroup is a Group over an aggregator.Ring whose ranks are exactly the
// group's. Every frame is tagged with the group id (in the high 32 bits
// of the frame's generation, the ring generation in the low 32), so a frame
// of another group, or of another generation, is refused with
// aggregator.ErrUnexpectedFrame. Sum uses aggregator.AllReduce; Max is an
// all-gather followed by a local maximum (the aggregator has no max
// reduction), so its wire volume is (n−1)·len(buf) values per rank.
type RingGroup struct {
	ring aggregator.Ring
	opt  aggregator.Options
	mu   sync.Mutex
	step int64
	tmp  []float32
}

// NewRingGroup returns the group id over r. gen is the ring generation
// (at most 32 bits); maxFrame is aggregator.Options.MaxFrameElems.
func NewRingGroup(r aggregator.Ring, id uint32, gen uint64, maxFrame int) (*RingGroup, error) {
	if gen > math.MaxUint32 {
		return nil, fmt.Errorf("tensorpar: generation %d does not fit 32 bits", gen)
	}
	opt := aggregator.Options{MaxFrameElems: maxFrame, Generation: uint64(id)<<32 | gen}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	return &RingGroup{ring: r, opt: opt}, nil
}

// Rank implements Group.
func (g *RingGroup) Rank() int { return g.ring.Rank() }

// Size implements Group.
func (g *RingGroup) Size() int { return g.ring.Size() }

func (g *RingGroup) next() int64 {
	g.step++
	return g.step
}

// AllReduce implements Group.
func (g *RingGroup) AllReduce(ctx context.Context, buf []float32, op ReduceOp) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch op {
	case Sum:
		return aggregator.AllReduce(ctx, g.ring, buf, g.next(), g.opt)
	case Max:
		n, k := g.ring.Size(), len(buf)
		if cap(g.tmp) < n*k {
			g.tmp = make([]float32, n*k)
		}
		all := g.tmp[:n*k]
		if err := aggregator.AllGather(ctx, g.ring, all, buf, g.next(), g.opt); err != nil {
			return err
		}
		for r := range n { // rank order: every rank computes the same maxima
			for i, v := range all[r*k : (r+1)*k] {
				if r == 0 || v > buf[i] {
					buf[i] = v
				}
			}
		}
		return nil
	}
	return fmt.Errorf("tensorpar: unknown reduction %v", op)
}

// AllGather implements Group.
func (g *RingGroup) AllGather(ctx context.Context, dst, src []float32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(dst) != g.ring.Size()*len(src) {
		return fmt.Errorf("tensorpar: AllGather: len(dst) = %d, want %d·%d", len(dst), g.ring.Size(), len(src))
	}
	return aggregator.AllGather(ctx, g.ring, dst, src, g.next(), g.opt)
}

// Broadcast implements Group: aggregator.Broadcast, root → root+1 → …
// along the ring, so every rank but the last passes len(buf) values on.
func (g *RingGroup) Broadcast(ctx context.Context, buf []float32, root int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return aggregator.Broadcast(ctx, g.ring, buf, root, g.next(), g.opt)
}

// Counts is the communication of a Group: operations and float32 values
// passed in (per rank, the len(buf) of an all-reduce or a broadcast,
// len(src) of an all-gather).
type Counts struct {
	AllReduceOps, AllReduceValues int64
	AllGatherOps, AllGatherValues int64
	BroadcastOps, BroadcastValues int64
}

// Counting wraps a Group and counts its calls.
type Counting struct {
	Group
	mu sync.Mutex
	c  Counts
}

// Counts returns the calls counted so far.
func (c *Counting) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

// Reset zeroes the counts.
func (c *Counting) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c = Counts{}
}

// AllReduce implements Group.
func (c *Counting) AllReduce(ctx context.Context, buf []float32, op ReduceOp) error {
	c.mu.Lock()
	c.c.AllReduceOps++
	c.c.AllReduceValues += int64(len(buf))
	c.mu.Unlock()
	return c.Group.AllReduce(ctx, buf, op)
}

// AllGather implements Group.
func (c *Counting) AllGather(ctx context.Context, dst, src []float32) error {
	c.mu.Lock()
	c.c.AllGatherOps++
	c.c.AllGatherValues += int64(len(src))
	c.mu.Unlock()
	return c.Group.AllGather(ctx, dst, src)
}

// Broadcast implements Group.
func (c *Counting) Broadcast(ctx context.Context, buf []float32, root int) error {
	c.mu.Lock()
	c.c.BroadcastOps++
	c.c.BroadcastValues += int64(len(buf))
	c.mu.Unlock()
	return c.Group.Broadcast(ctx, buf, root)
}
