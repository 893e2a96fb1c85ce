package agent

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// countedRing counts the bytes taken from the left neighbour, as
// ringrpc's ring does (its Traffic).
type countedRing struct {
	aggregator.Ring
	recv atomic.Int64
}

func (c *countedRing) RecvLeft(ctx context.Context) (aggregator.Frame, error) {
	f, err := c.Ring.RecvLeft(ctx)
	if err == nil {
		c.recv.Add(4 * int64(len(f.Data)))
	}
	return f, err
}

func (c *countedRing) Traffic() (sent, received int64, right, left string) {
	return 0, c.recv.Load(), "", ""
}

// TestHungRankNamed: rank 1 of 3 never makes the all-reduce ranks 0 and 2
// make. At the step timeout rank 2, whose left neighbour sent nothing,
// names rank 1 (with its address) as the rank that never joined; rank 0,
// which got frames from its left neighbour, says the call did not
// complete without blaming anyone.
func TestHungRankNamed(t *testing.T) {
	const n = 3
	rings := aggregator.NewMemRing(n, 64)
	t.Cleanup(func() {
		for _, r := range rings {
			r.(*aggregator.MemRing).Close()
		}
	})
	peers := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}
	servers := make([]*Server, n)
	for r := range n {
		s, err := New(Config{Ring: &countedRing{Ring: rings[r]}, JobID: "job-1", StepTimeout: 300 * time.Millisecond, Peers: peers})
		if err != nil {
			t.Fatal(err)
		}
		servers[r] = s
	}
	ctx := ctxT(t)
	errs := onAll(n, func(r int) error {
		if r == 1 {
			return nil // hung: never calls
		}
		_, err := servers[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: 0, Data: encode(make([]float32, 3000)), Average: true})
		return err
	})
	for _, r := range []int{0, 2} {
		if status.Code(errs[r]) != codes.DeadlineExceeded {
			t.Fatalf("rank %d: %v, want DeadlineExceeded", r, errs[r])
		}
	}
	if msg := errs[2].Error(); !strings.Contains(msg, "rank 1 (10.0.0.2:7000) never joined it") {
		t.Errorf("rank 2 (right of the hung rank): %q, want rank 1 named as never joining", msg)
	}
	if msg := errs[0].Error(); strings.Contains(msg, "never joined") {
		t.Errorf("rank 0 (its left neighbour joined): %q blames a rank", msg)
	}
}
