package coordinator

import (
	"fmt"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// RingCulprit finds the rank cut off from a ring from every rank's frame
// counts after the ring stalled (links[r] is rank r's report). Link
// r → r+1 lost frames when r sent more than arrived at r+1 and r+1's left
// link has been idle for at least minIdle seconds (a link that is merely
// slow, or a rank that closed while frames were in flight, is not idle
// that long). A rank at both ends of broken links is cut off; with a single
// broken link the rank whose endpoint stopped receiving is (its address is
// what its neighbour cannot reach). Any other pattern names nobody.
func RingCulprit(links []*pb.RingLinks, minIdle float64) (culprit int, why string, ok bool) {
	n := len(links)
	if n < 2 {
		return 0, "", false
	}
	for _, l := range links {
		if l == nil {
			return 0, "", false
		}
	}
	var broken []int // senders of broken links
	ends := make([]int, n)
	for r := range n {
		to := (r + 1) % n
		if links[r].FramesSent > links[to].FramesReceived && links[to].LeftIdleSeconds >= minIdle {
			broken = append(broken, r)
			ends[r]++
			ends[to]++
		}
	}
	describe := func(r int) string {
		to := (r + 1) % n
		return fmt.Sprintf("rank %d sent %d frames to rank %d, %d arrived, none for %.1fs",
			r, links[r].FramesSent, to, links[to].FramesReceived, links[to].LeftIdleSeconds)
	}
	switch {
	case len(broken) == 1:
		return (broken[0] + 1) % n, describe(broken[0]), true
	case len(broken) == 2 && n > 2:
		for r, k := range ends {
			if k == 2 {
				return r, describe(broken[0]) + "; " + describe(broken[1]), true
			}
		}
	}
	return 0, "", false
}

// RingLinks gathers one generation's failure reports (each rank's frame
// counts) until they name the rank cut off.
type RingLinks struct {
	gen   uint64
	links []*pb.RingLinks
}

// Report adds rank's report from generation gen of world ranks and, once
// the reports so far name a culprit, returns it (and forgets them).
func (l *RingLinks) Report(gen uint64, world, rank int, links *pb.RingLinks, minIdle float64) (culprit int, why string, ok bool) {
	if links == nil || rank < 0 || rank >= world {
		return 0, "", false
	}
	if l.links == nil || l.gen != gen || len(l.links) != world {
		l.links, l.gen = make([]*pb.RingLinks, world), gen
	}
	l.links[rank] = links
	culprit, why, ok = RingCulprit(l.links, minIdle)
	if ok {
		l.links = nil
	}
	return culprit, why, ok
}
