package agent

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/paramserver/psstep"
)

// Collective carries the script's collective calls to the other ranks:
// the job's ring (OverRing, mode ring) or its parameter-server shards
// summing them (paramserver.ScriptClient, mode ps). The Server hands it
// one call at a time, in sequence-number order, and does everything else
// (turns, the step timeout, averaging, shared memory, failure) the same
// way whichever carries them.
type Collective interface {
	Rank() int
	Size() int
	// Do runs call with this rank's values buf (call.Len of them, for a
	// sum or a broadcast), which receive the result: the sum over the
	// ranks, or the root's values bit for bit. A barrier returns once
	// every rank made it; a layout call fails unless every rank
	// registered the same layout (FailedPrecondition). An error leaves
	// the collective unusable.
	Do(ctx context.Context, call psstep.Call, buf []float32) error
}

// OverRing is the Collective of a job's ring (its gRPC or shared-memory
// transport) with the generation that tags its frames.
func OverRing(r aggregator.Ring, generation uint64) Collective {
	return &ringCollective{ring: r, opt: aggregator.Options{Generation: generation}}
}

type ringCollective struct {
	ring aggregator.Ring
	opt  aggregator.Options
}

func (r *ringCollective) Rank() int { return r.ring.Rank() }
func (r *ringCollective) Size() int { return r.ring.Size() }

func (r *ringCollective) Do(ctx context.Context, call psstep.Call, buf []float32) error {
	switch call.Kind {
	case psstep.CallSum:
		return aggregator.AllReduce(ctx, r.ring, buf, call.Seq, r.opt)
	case psstep.CallBroadcast:
		return aggregator.Broadcast(ctx, r.ring, buf, call.Root, call.Seq, r.opt)
	case psstep.CallBarrier:
		return aggregator.Barrier(ctx, r.ring, call.Seq, r.opt)
	case psstep.CallLayout:
		// An all-gather of every rank's layout: its size and checksum,
		// each in 16-bit pieces, which float32 holds exactly.
		world := r.ring.Size()
		mine := layoutWords(call.Lay)
		all := make([]float32, len(mine)*world)
		if err := aggregator.AllGather(ctx, r.ring, all, mine, call.Seq, r.opt); err != nil {
			return err
		}
		for rk := range world {
			for i, w := range mine {
				if all[rk*len(mine)+i] != w {
					return status.Errorf(codes.FailedPrecondition, "rank %d registered another gradient layout than rank %d (names, shapes or dtypes differ)", rk, r.ring.Rank())
				}
			}
		}
		return nil
	}
	panic(fmt.Sprintf("agent: a call of kind %v", call.Kind))
}

// layoutWords is a layout as float32 values that hold it exactly.
func layoutWords(l psstep.Layout) []float32 {
	n := uint64(l.Elements)
	return []float32{float32(l.Checksum >> 16), float32(l.Checksum & 0xffff),
		float32(n >> 48), float32(n >> 32 & 0xffff), float32(n >> 16 & 0xffff), float32(n & 0xffff)}
}
