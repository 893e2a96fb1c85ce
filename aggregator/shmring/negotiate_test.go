//go:build linux

package shmring_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/shmring"
)

// negotiate runs Negotiate on every rank of an in-memory control ring of
// n ranks and returns each rank's ring (nil: stayed on the control ring)
// and reason.
func negotiate(t *testing.T, n int, dir string, secret []byte) ([]*shmring.Ring, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl := aggregator.NewMemRing(n, 4)
	t.Cleanup(func() {
		for _, r := range ctl {
			r.(*aggregator.MemRing).Close()
		}
	})
	rings, whys := make([]*shmring.Ring, n), make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { // owned by this helper: waited for below
			defer wg.Done()
			rings[r], whys[r], errs[r] = shmring.Negotiate(ctx, ctl[r], shmring.Config{Dir: dir, JobID: "job-1", Generation: 2, Secret: secret}, aggregator.Options{Generation: 2})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rings {
			if r != nil {
				r.Close()
			}
		}
	})
	return rings, whys
}

// TestNegotiateOneHost: ranks on one host move to shared memory (with a
// secret of their own or rank 0's fresh one), the rings sum like the
// serial sum, and the directory is empty afterwards.
func TestNegotiateOneHost(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		for _, sec := range [][]byte{nil, secret} {
			dir := segDir(t)
			rings, whys := negotiate(t, n, dir, sec)
			for r := range n {
				if rings[r] == nil {
					t.Fatalf("n=%d rank %d stayed on the control ring: %s", n, r, whys[r])
				}
			}
			if es := shmring.Entries(t, dir); len(es) != 0 {
				t.Errorf("n=%d: %v left in the directory", n, es)
			}
			// An all-reduce over the new rings: rank r holds r+1+i at i.
			const length = 1001
			var wg sync.WaitGroup
			bufs := make([][]float32, n)
			errs := make([]error, n)
			for r := range n {
				bufs[r] = make([]float32, length)
				for i := range bufs[r] {
					bufs[r][i] = float32(r + 1 + i)
				}
				wg.Add(1)
				go func() { // owned by the test: waited for below
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					errs[r] = aggregator.AllReduce(ctx, rings[r], bufs[r], 0, aggregator.Options{Generation: 2})
				}()
			}
			wg.Wait()
			for r := range n {
				if errs[r] != nil {
					t.Fatalf("n=%d rank %d: %v", n, r, errs[r])
				}
				for i, v := range bufs[r] {
					want := float32(0)
					for q := range n {
						want += float32(q + 1 + i)
					}
					if v != want {
						t.Fatalf("n=%d rank %d: [%d] = %v, want %v", n, r, i, v, want)
					}
				}
			}
		}
	}
}

// TestNegotiateFallsBack: every rank stays on the control ring, with
// one reason for all and nothing left behind, when one rank is on
// another host, or when no rank can use the directory.
func TestNegotiateFallsBack(t *testing.T) {
	t.Run("another host", func(t *testing.T) {
		var calls atomic.Int32
		shmring.SetHostID(t, func(dir string) (string, error) {
			if calls.Add(1) == 1 {
				return "some other machine", nil
			}
			return shmring.HostID(dir)
		})
		dir := segDir(t)
		rings, whys := negotiate(t, 3, dir, nil)
		for r := range 3 {
			if rings[r] != nil || whys[r] != "the ranks are on more than one host" {
				t.Errorf("rank %d: ring %v, reason %q; want the control ring, on more than one host", r, rings[r] != nil, whys[r])
			}
		}
		if es := shmring.Entries(t, dir); len(es) != 0 {
			t.Errorf("%v left in the directory", es)
		}
	})
	t.Run("no directory", func(t *testing.T) {
		rings, whys := negotiate(t, 2, "/nonexistent/gradsync-shm", nil)
		for r := range 2 {
			if rings[r] != nil || !strings.Contains(whys[r], "2 rank(s) cannot use shared memory here") {
				t.Errorf("rank %d: ring %v, reason %q; want the control ring, every rank unable", r, rings[r] != nil, whys[r])
			}
		}
	})
}
