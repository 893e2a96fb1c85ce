package aggregator_test

import (
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/peertest"
	"github.com/gradsync/gradsync/aggregator/ringtest"
)

func newMemPeers(buffer int) peertest.NewPeers {
	return func(t *testing.T, n int) []aggregator.Peers {
		ps := aggregator.NewMemPeers(n, buffer)
		t.Cleanup(func() {
			for _, p := range ps {
				p.(io.Closer).Close()
			}
		})
		return ps
	}
}

func TestMemPeers(t *testing.T) {
	// Unbuffered links are the hardest case for deadlock freedom.
	for _, buffer := range []int{0, 4} {
		t.Run(fmt.Sprintf("buffer=%d", buffer), func(t *testing.T) {
			peertest.Run(t, newMemPeers(buffer))
		})
	}
}

// TestMemPeersAsRing: a Peers seen through PeerRing passes the ring suite.
func TestMemPeersAsRing(t *testing.T) {
	ringtest.Run(t, func(t *testing.T, n int) []aggregator.Ring {
		ps := newMemPeers(2)(t, n)
		rs := make([]aggregator.Ring, n)
		for i, p := range ps {
			rs[i] = aggregator.PeerRing(p)
		}
		return rs
	})
}

// TestPairPeers: a Peers made of two-rank MemRings, one per pair, passes
// the suite; so does any Ring transport that can make two-rank rings.
func TestPairPeers(t *testing.T) {
	peertest.Run(t, func(t *testing.T, n int) []aggregator.Peers {
		ps := peertest.Pairs(n, func(i, j int) (aggregator.Ring, aggregator.Ring) {
			r := aggregator.NewMemRing(2, 1)
			return r[0], r[1]
		})
		t.Cleanup(func() {
			for _, p := range ps {
				p.(io.Closer).Close()
			}
		})
		return ps
	})
}

// TestPeersOf: the pairs each algorithm uses, among them the fold of a
// non-power-of-two world onto the largest power of two (5 → 4: rank 0
// hands its buffer to rank 1 and talks to no one else).
func TestPeersOf(t *testing.T) {
	for _, c := range []struct {
		a       aggregator.Algorithm
		rank, n int
		want    []int
	}{
		{aggregator.AlgoRing, 0, 1, nil},
		{aggregator.AlgoRing, 0, 2, []int{1}},
		{aggregator.AlgoRing, 0, 5, []int{1, 4}},
		{aggregator.AlgoHalvingDoubling, 0, 1, nil},
		{aggregator.AlgoHalvingDoubling, 0, 4, []int{1, 2}},
		{aggregator.AlgoHalvingDoubling, 0, 5, []int{1}},
		{aggregator.AlgoHalvingDoubling, 1, 5, []int{0, 2, 3}},
		{aggregator.AlgoHalvingDoubling, 4, 5, []int{2, 3}},
		{aggregator.AlgoTree, 0, 5, []int{1, 2}},
		{aggregator.AlgoTree, 1, 5, []int{0, 3, 4}},
		{aggregator.AlgoTree, 4, 5, []int{1}},
	} {
		if got := aggregator.PeersOf(c.a, c.rank, c.n); !slices.Equal(got, c.want) {
			t.Errorf("%v rank %d of %d: %v, want %v", c.a, c.rank, c.n, got, c.want)
		}
	}
}
