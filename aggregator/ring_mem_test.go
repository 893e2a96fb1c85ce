package aggregator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringtest"
)

func newMemRing(buffer int) func(t *testing.T, n int) []aggregator.Ring {
	return func(t *testing.T, n int) []aggregator.Ring {
		rings := aggregator.NewMemRing(n, buffer)
		t.Cleanup(func() {
			for _, r := range rings {
				r.(io.Closer).Close()
			}
		})
		return rings
	}
}

func TestMemRing(t *testing.T) {
	// Unbuffered links are the hardest case for deadlock freedom; 4 is a
	// typical bounded inbox.
	for _, buffer := range []int{0, 4} {
		t.Run(fmt.Sprintf("buffer=%d", buffer), func(t *testing.T) {
			ringtest.Run(t, newMemRing(buffer))
		})
	}
}

// TestMemRingDeadNeighbours checks that both neighbours of a dead rank name
// it: the right one on receive, the left one on send.
func TestMemRingDeadNeighbours(t *testing.T) {
	for _, n := range []int{2, 3, 6} {
		rings := newMemRing(1)(t, n)
		victim := n - 1
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
		defer cancel()
		rings[victim].(io.Closer).Close()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for rank := range n - 1 {
			wg.Go(func() {
				// Neighbours fail at once; other ranks would wait for this
				// context, so they do not take part.
				if rank != 0 && rank != victim-1 {
					return
				}
				errs[rank] = aggregator.AllReduce(ctx, rings[rank], make([]float32, 1000), 1, aggregator.Options{})
			})
		}
		wg.Wait()
		for _, rank := range []int{0, victim - 1} {
			var pe *aggregator.PeerError
			if !errors.As(errs[rank], &pe) || pe.Rank != victim || !errors.Is(errs[rank], aggregator.ErrPeerGone) {
				t.Errorf("n=%d rank %d: got %v, want *PeerError{Rank: %d} wrapping ErrPeerGone", n, rank, errs[rank], victim)
			}
		}
		if err := aggregator.Barrier(t.Context(), rings[victim], 1, aggregator.Options{}); !errors.Is(err, aggregator.ErrClosed) {
			t.Errorf("n=%d: dead rank's own call: got %v, want ErrClosed", n, err)
		}
	}
}

func TestMemRingContext(t *testing.T) {
	rings := aggregator.NewMemRing(3, 0)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := rings[0].RecvLeft(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("RecvLeft: got %v, want context.Canceled", err)
	}
	if err := rings[0].SendRight(ctx, aggregator.Frame{}); !errors.Is(err, context.Canceled) {
		t.Errorf("SendRight: got %v, want context.Canceled", err)
	}
	// A call under a cancelled context fails with the context error.
	err := aggregator.AllReduce(ctx, rings[1], make([]float32, 10), 1, aggregator.Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("AllReduce: got %v, want context.Canceled", err)
	}
}

func BenchmarkAllReduceMem(b *testing.B) {
	for _, mib := range []int{1, 4, 16} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("%dMiB/ranks=%d", mib, n), func(b *testing.B) {
				l := mib << 20 / 4
				rings := aggregator.NewMemRing(n, 4)
				bufs := make([][]float32, n)
				for r := range bufs {
					// Zeros stay finite however often they are summed; the
					// cost of an add does not depend on the values.
					bufs[r] = make([]float32, l)
				}
				b.SetBytes(int64(l * 4))
				b.ReportAllocs()
				ctx := b.Context()
				errs := make([]error, n)
				step := int64(0)
				for b.Loop() {
					step++
					var wg sync.WaitGroup
					for r := range n {
						wg.Go(func() { errs[r] = aggregator.AllReduce(ctx, rings[r], bufs[r], step, aggregator.Options{}) })
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							b.Fatalf("rank %d: %v", r, err)
						}
					}
				}
			})
		}
	}
}
