package aggregator_test

import (
	"fmt"
	"io"
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
		pairs := make([][]aggregator.Ring, n)
		for i := range pairs {
			pairs[i] = make([]aggregator.Ring, n)
		}
		for i := range n {
			for j := i + 1; j < n; j++ {
				r := aggregator.NewMemRing(2, 1)
				pairs[i][j], pairs[j][i] = r[0], r[1]
			}
		}
		ps := make([]aggregator.Peers, n)
		for i := range n {
			ps[i] = aggregator.NewPairPeers(i, pairs[i])
		}
		t.Cleanup(func() {
			for _, p := range ps {
				p.(io.Closer).Close()
			}
		})
		return ps
	})
}
