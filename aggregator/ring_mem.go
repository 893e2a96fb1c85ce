package aggregator

import (
	"context"
	"fmt"
	"sync"
)

// MemRing is one rank of an in-memory ring made by NewMemRing: the real
// thing on a fake wire, for tests and single-process runs. Links are
// buffered channels; SendRight copies the payload, as a wire would, into a
// buffer recycled from the receiver, so a steady stream of frames does not
// allocate.
type MemRing struct {
	rank, n     int
	left, right *MemRing
	out         *memLink // to right; in is left.out

	dead      chan struct{} // closed by Close
	closeOnce sync.Once

	// last is the Data of the frame RecvLeft returned last; it goes back to
	// the link's free list on the next RecvLeft. Only RecvLeft touches it.
	last []float32
}

// memLink is the one-way link from a rank to its right neighbour.
type memLink struct {
	frames chan Frame
	free   chan []float32 // payload buffers the receiver is done with
}

// NewMemRing connects n ranks in a ring whose links each buffer up to
// buffer frames (0: unbuffered). Element i is rank i; each is a *MemRing.
func NewMemRing(n, buffer int) []Ring {
	if n < 1 || buffer < 0 {
		panic(fmt.Sprintf("aggregator: NewMemRing(%d, %d): want n >= 1 and buffer >= 0", n, buffer))
	}
	ms := make([]*MemRing, n)
	for i := range ms {
		ms[i] = &MemRing{
			rank: i,
			n:    n,
			out: &memLink{
				frames: make(chan Frame, buffer),
				free:   make(chan []float32, buffer+2), // in the channel, held by the receiver, being filled
			},
			dead: make(chan struct{}),
		}
	}
	rs := make([]Ring, n)
	for i, m := range ms {
		m.left, m.right = ms[mod(i-1, n)], ms[mod(i+1, n)]
		rs[i] = m
	}
	return rs
}

// Rank implements Ring.
func (m *MemRing) Rank() int { return m.rank }

// Size implements Ring.
func (m *MemRing) Size() int { return m.n }

// Close breaks this rank, as if its process died: its own calls return
// ErrClosed and its neighbours' calls return a *PeerError naming it. Close
// is idempotent and always returns nil.
func (m *MemRing) Close() error {
	m.closeOnce.Do(func() { close(m.dead) })
	return nil
}

func (m *MemRing) peerGone(p *MemRing) error { return &PeerError{Rank: p.rank, Err: ErrPeerGone} }

// SendRight implements Ring. It copies f.Data before queueing the frame.
func (m *MemRing) SendRight(ctx context.Context, f Frame) error {
	if err := m.broken(ctx, m.right); err != nil {
		return err
	}
	f.Data = m.out.fill(f.Data)
	select {
	case m.out.frames <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.dead:
		return ErrClosed
	case <-m.right.dead:
		return m.peerGone(m.right)
	}
}

// RecvLeft implements Ring. Frames the left neighbour queued before it was
// closed are still delivered when they are already waiting.
func (m *MemRing) RecvLeft(ctx context.Context) (Frame, error) {
	in := m.left.out
	if m.last != nil {
		select {
		case in.free <- m.last:
		default:
		}
		m.last = nil
	}
	if err := m.broken(ctx, nil); err != nil {
		return Frame{}, err
	}
	select {
	case f := <-in.frames:
		m.last = f.Data
		return f, nil
	default:
	}
	select {
	case f := <-in.frames:
		m.last = f.Data
		return f, nil
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	case <-m.dead:
		return Frame{}, ErrClosed
	case <-m.left.dead:
		return Frame{}, m.peerGone(m.left)
	}
}

// broken reports a done context, this rank closed, or peer (if not nil)
// closed, in that order.
func (m *MemRing) broken(ctx context.Context, peer *MemRing) error {
	if peer == nil {
		return memBroken(ctx, m.dead, nil, 0)
	}
	return memBroken(ctx, m.dead, peer.dead, peer.rank)
}

// memBroken is the in-memory transports' check before and while they
// wait: a done context, this rank's dead channel closed (ErrClosed), or
// the peer's (if not nil) closed (a *PeerError naming peerRank), in that
// order.
func memBroken(ctx context.Context, dead, peerDead <-chan struct{}, peerRank int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-dead:
		return ErrClosed
	default:
	}
	if peerDead != nil {
		select {
		case <-peerDead:
			return &PeerError{Rank: peerRank, Err: ErrPeerGone}
		default:
		}
	}
	return nil
}

// fill returns a copy of src in a recycled buffer when one is free.
func (l *memLink) fill(src []float32) []float32 {
	if len(src) == 0 {
		return nil
	}
	var b []float32
	select {
	case b = <-l.free:
	default:
	}
	if cap(b) < len(src) {
		b = make([]float32, len(src))
	}
	b = b[:len(src)]
	copy(b, src)
	return b
}
