package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Peers is this rank's view of a group in which every rank may send to
// every other, the transport of the peer-to-peer all-reduce algorithms
// (AllReduceHalvingDoubling, AllReduceTree). It is to those algorithms
// what Ring is to the ring collectives; PeerRing presents any Peers as a
// Ring, so the ring algorithms run over it too.
//
// Contract, relied on by the collectives in this package:
//   - Frames sent with Send(ctx, to, f) arrive at rank to's Recv(ctx,
//     from) (from being this rank) in the order they were sent, each
//     exactly once. There is no order between different pairs.
//   - to and from are ranks in [0, Size()) other than Rank(); anything
//     else is a programming bug and panics.
//   - Send must not retain f.Data after it returns successfully (it
//     copies or finishes writing the bytes first); the caller may modify
//     it afterwards. After a Send that failed, a zero-copy implementation
//     may go on reading f.Data until the Peers is closed, as with
//     Ring.SendRight.
//   - The Data of a Frame returned by Recv is owned by the Peers and is
//     valid only until the next Recv call (from any peer), so
//     implementations may reuse receive buffers.
//   - Send may block while the link to its peer is full; the collectives
//     never wait on Send and Recv in the same goroutine, and send each
//     peer's frames from a goroutine of its own, so a Send blocked on one
//     peer holds up no other, and any amount of buffering (even none) is
//     deadlock-free.
//   - Send may be called concurrently for different destinations, never
//     concurrently for the same one. Recv is never called concurrently
//     with itself; one goroutine may call Recv while others call Send.
//   - Both methods return promptly once ctx is done. A broken peer is
//     reported as a *PeerError naming its rank and wrapping ErrPeerGone.
//
// Implementations: NewMemPeers (in memory, every pair a link) and
// NewPairPeers, which builds a Peers from one two-rank Ring per pair, so
// that a Ring transport carries the peer algorithms once a two-rank ring
// has been set up for each pair of ranks that talk (PeersOf says which
// pairs those are): shmring's and ringrpc's tests run peertest that way.
type Peers interface {
	Rank() int
	Size() int
	Send(ctx context.Context, to int, f Frame) error
	Recv(ctx context.Context, from int) (Frame, error)
}

// PeerRing presents p as a Ring: SendRight is Send to rank+1 and RecvLeft
// is Recv from rank−1 (mod Size). If p implements io.Closer, so does the
// result. With a single rank, neither method may be called (the
// collectives never do).
func PeerRing(p Peers) Ring {
	if c, ok := p.(io.Closer); ok {
		return closingPeerRing{peerRing{p}, c}
	}
	return peerRing{p}
}

type peerRing struct{ p Peers }

func (r peerRing) Rank() int { return r.p.Rank() }
func (r peerRing) Size() int { return r.p.Size() }

func (r peerRing) SendRight(ctx context.Context, f Frame) error {
	return r.p.Send(ctx, mod(r.p.Rank()+1, r.p.Size()), f)
}

func (r peerRing) RecvLeft(ctx context.Context) (Frame, error) {
	return r.p.Recv(ctx, mod(r.p.Rank()-1, r.p.Size()))
}

type closingPeerRing struct {
	peerRing
	io.Closer
}

// PairPeers is a Peers made of one two-rank Ring per peer: the ring
// between ranks i < j has i as its rank 0 and j as its rank 1, so each
// rank's SendRight reaches the other and RecvLeft hears from it. Made by
// NewPairPeers.
type PairPeers struct {
	rank  int
	pairs []Ring // pairs[j]: the two-rank ring shared with rank j; nil for this rank and unconnected peers
}

// NewPairPeers returns rank's Peers over pairs, where pairs[j] (for every
// j ≠ rank this rank will talk to) is a two-rank Ring shared with rank j,
// in which the lower of the two ranks is rank 0. len(pairs) is the group
// size; entries for peers this rank never talks to may be nil (Send or
// Recv with such a peer panics). PeersOf says which peers an algorithm
// needs. NewPairPeers panics if a ring has the wrong size or rank.
func NewPairPeers(rank int, pairs []Ring) *PairPeers {
	n := len(pairs)
	if rank < 0 || rank >= n {
		panic(fmt.Sprintf("aggregator: NewPairPeers: rank %d out of range [0, %d)", rank, n))
	}
	for j, r := range pairs {
		if r == nil {
			continue
		}
		want := 0
		if rank > j {
			want = 1
		}
		if j == rank || r.Size() != 2 || r.Rank() != want {
			panic(fmt.Sprintf("aggregator: NewPairPeers: rank %d: pairs[%d] is rank %d of %d, want rank %d of 2 (and no ring with itself)",
				rank, j, r.Rank(), r.Size(), want))
		}
	}
	return &PairPeers{rank: rank, pairs: pairs}
}

// Rank implements Peers.
func (p *PairPeers) Rank() int { return p.rank }

// Size implements Peers.
func (p *PairPeers) Size() int { return len(p.pairs) }

func (p *PairPeers) pair(peer int) Ring {
	if peer < 0 || peer >= len(p.pairs) || peer == p.rank || p.pairs[peer] == nil {
		panic(fmt.Sprintf("aggregator: PairPeers rank %d: no link with rank %d", p.rank, peer))
	}
	return p.pairs[peer]
}

// Send implements Peers.
func (p *PairPeers) Send(ctx context.Context, to int, f Frame) error {
	return pairError(p.pair(to).SendRight(ctx, f), to)
}

// Recv implements Peers.
func (p *PairPeers) Recv(ctx context.Context, from int) (Frame, error) {
	f, err := p.pair(from).RecvLeft(ctx)
	return f, pairError(err, from)
}

// pairError renames the peer of a two-rank ring's *PeerError (rank 0 or
// 1 of that ring) to its rank in the group.
func pairError(err error, peer int) error {
	var pe *PeerError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	return &PeerError{Rank: peer, Err: fmt.Errorf("%w (link error: %v)", pe.Err, err)}
}

// Close closes every pair ring that implements io.Closer and returns the
// first error.
func (p *PairPeers) Close() error {
	var first error
	for _, r := range p.pairs {
		if c, ok := r.(io.Closer); ok {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
