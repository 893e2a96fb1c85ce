package aggregator

import (
	"context"
	"fmt"
	"sync"
)

// MemPeers is one rank of an in-memory group made by NewMemPeers: every
// ordered pair of ranks has its own link, a buffered channel, and Send
// copies the payload into a buffer recycled from the receiver, as
// MemRing does.
type MemPeers struct {
	rank  int
	group []*MemPeers
	out   []*memLink // out[j]: the link to rank j; nil for this rank

	dead      chan struct{} // closed by Close
	closeOnce sync.Once

	// last[j] is the Data of the frame Recv(j) returned last; it goes back
	// to that link's free list on the next Recv. Only Recv touches it.
	last [][]float32
}

// NewMemPeers connects n ranks pairwise with links that each buffer up to
// buffer frames (0: unbuffered). Element i is rank i; each is a *MemPeers.
func NewMemPeers(n, buffer int) []Peers {
	if n < 1 || buffer < 0 {
		panic(fmt.Sprintf("aggregator: NewMemPeers(%d, %d): want n >= 1 and buffer >= 0", n, buffer))
	}
	ms := make([]*MemPeers, n)
	for i := range ms {
		ms[i] = &MemPeers{rank: i, group: ms, out: make([]*memLink, n), dead: make(chan struct{}), last: make([][]float32, n)}
		for j := range n {
			if j != i {
				ms[i].out[j] = &memLink{frames: make(chan Frame, buffer), free: make(chan []float32, buffer+2)}
			}
		}
	}
	ps := make([]Peers, n)
	for i, m := range ms {
		ps[i] = m
	}
	return ps
}

// Rank implements Peers.
func (m *MemPeers) Rank() int { return m.rank }

// Size implements Peers.
func (m *MemPeers) Size() int { return len(m.group) }

// Close breaks this rank, as if its process died: its own calls return
// ErrClosed and its peers' calls with it return a *PeerError naming it.
// Close is idempotent and always returns nil.
func (m *MemPeers) Close() error {
	m.closeOnce.Do(func() { close(m.dead) })
	return nil
}

func (m *MemPeers) peer(j int) *MemPeers {
	if j < 0 || j >= len(m.group) || j == m.rank {
		panic(fmt.Sprintf("aggregator: MemPeers rank %d: no link with rank %d", m.rank, j))
	}
	return m.group[j]
}

// Send implements Peers. It copies f.Data before queueing the frame.
func (m *MemPeers) Send(ctx context.Context, to int, f Frame) error {
	p := m.peer(to)
	if err := m.broken(ctx, p); err != nil {
		return err
	}
	l := m.out[to]
	f.Data = l.fill(f.Data)
	select {
	case l.frames <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.dead:
		return ErrClosed
	case <-p.dead:
		return &PeerError{Rank: to, Err: ErrPeerGone}
	}
}

// Recv implements Peers. Frames the peer queued before it was closed are
// still delivered when they are already waiting.
func (m *MemPeers) Recv(ctx context.Context, from int) (Frame, error) {
	p := m.peer(from)
	in := p.out[m.rank]
	if b := m.last[from]; b != nil {
		select {
		case in.free <- b:
		default:
		}
		m.last[from] = nil
	}
	if err := m.broken(ctx, nil); err != nil {
		return Frame{}, err
	}
	select {
	case f := <-in.frames:
		m.last[from] = f.Data
		return f, nil
	default:
	}
	select {
	case f := <-in.frames:
		m.last[from] = f.Data
		return f, nil
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	case <-m.dead:
		return Frame{}, ErrClosed
	case <-p.dead:
		return Frame{}, &PeerError{Rank: from, Err: ErrPeerGone}
	}
}

// broken reports a done context, this rank closed, or peer (if not nil)
// closed, in that order (memBroken).
func (m *MemPeers) broken(ctx context.Context, peer *MemPeers) error {
	if peer == nil {
		return memBroken(ctx, m.dead, nil, 0)
	}
	return memBroken(ctx, m.dead, peer.dead, peer.rank)
}
