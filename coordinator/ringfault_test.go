package coordinator_test

import (
	"testing"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestRingCulprit: the link that lost frames (sent > arrived, receiver
// idle) names the rank cut off; closing races and slow links name nobody.
func TestRingCulprit(t *testing.T) {
	l := func(sent, recv int64, idle float64) *pb.RingLinks {
		return &pb.RingLinks{FramesSent: sent, FramesReceived: recv, LeftIdleSeconds: idle}
	}
	cases := []struct {
		name  string
		links []*pb.RingLinks
		want  int // -1: nobody
	}{
		{"link 0→1 cut", []*pb.RingLinks{l(40, 38, 0.1), l(38, 36, 2.9), l(38, 38, 0.2)}, 1},
		{"rank 2 cut off both ways", []*pb.RingLinks{l(40, 36, 0.1), l(40, 40, 0.2), l(36, 36, 3), l(40, 40, 0.1)}, 2},
		{"frames in flight at a close", []*pb.RingLinks{l(40, 38, 0.1), l(38, 36, 0.01), l(38, 38, 0.2)}, -1},
		{"no frame lost", []*pb.RingLinks{l(40, 40, 3), l(40, 40, 3), l(40, 40, 3)}, -1},
		{"a rank has not reported", []*pb.RingLinks{l(40, 38, 0.1), nil, l(38, 38, 0.2)}, -1},
		{"two separate cuts", []*pb.RingLinks{l(40, 30, 3), l(40, 40, 0.1), l(40, 30, 3), l(40, 40, 0.1)}, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why, ok := coordinator.RingCulprit(tc.links, 1.5)
			if !ok {
				got = -1
			}
			if got != tc.want {
				t.Errorf("culprit %d (%q); want %d", got, why, tc.want)
			}
		})
	}
}
