// Package suite holds what the collective suites share — ringtest's over
// aggregator.Ring implementations and peertest's over aggregator.Peers:
// running a call on every rank at once, the timeouts healthy and failing
// calls get, and the failing-case runner that checks that no rank hung.
package suite

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Timeouts. Healthy calls get OKTimeout (generous for -race on small
// machines); calls that are expected to fail get FailTimeout, and must
// return within FailTimeout+Grace.
const (
	OKTimeout   = 2 * time.Minute
	FailTimeout = 2 * time.Second
	Grace       = 10 * time.Second
)

// Each runs fn for every rank at once (ranks[i] is rank i) and returns
// each rank's error and how long its call took.
func Each[T any](ctx context.Context, ranks []T, fn func(ctx context.Context, rank int, r T) error) ([]error, []time.Duration) {
	errs := make([]error, len(ranks))
	took := make([]time.Duration, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() {
			start := time.Now()
			errs[i] = fn(ctx, i, r)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	return errs, took
}

// OKCtx is a healthy call's context, cancelled when the test ends.
func OKCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), OKTimeout)
	t.Cleanup(cancel)
	return ctx
}

// MustAll stops the test at the first rank that failed.
func MustAll(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

// ExactInput is rank r's element i in the exact-sum checks: small whole
// numbers, so that any order of float32 additions gives the same sum.
func ExactInput(r, i int) float32 { return float32((r + 1) * (i%251 + 1)) }

// FailCase is a call every rank of Ranks makes that is expected to fail;
// Check judges the ranks' errors.
type FailCase[T any] struct {
	Name  string
	Ranks []T
	Call  func(ctx context.Context, rank int, r T) error
	Check func(t *testing.T, errs []error)
}

// RunFailing runs every case under one FailTimeout context, checks that no
// rank hung, and then runs each case's Check as a subtest.
func RunFailing[T any](t *testing.T, cases []FailCase[T]) {
	ctx, cancel := context.WithTimeout(t.Context(), FailTimeout)
	defer cancel()
	errs := make([][]error, len(cases))
	took := make([][]time.Duration, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() { errs[i], took[i] = Each(ctx, c.Ranks, c.Call) })
	}
	wg.Wait()
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			for r, d := range took[i] {
				if d > FailTimeout+Grace {
					t.Errorf("rank %d: returned after %v, want within %v of the %v deadline", r, d, Grace, FailTimeout)
				}
			}
			c.Check(t, errs[i])
		})
	}
}
