package stage_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// TestNoDeadlockUnderLinkDelays is the deadlock check: 200 steps
// with a random delay of 0–20 ms before every transfer on every stage
// link (both ends), for both schedules and M < S, M = S and M > S, over
// rendezvous links (capacity 0: a send waits for its receive, the
// strictest ordering), must finish within the deadline and train exactly
// as one worker does. The cases sleep rather than compute, so they run
// side by side (goroutines, not t.Parallel, which -parallel would bound
// to the machine's two cores).
func TestNoDeadlockUnderLinkDelays(t *testing.T) {
	if testing.Short() {
		t.Skip("200 steps with up to 20 ms on every transfer: about a minute")
	}
	const S, steps = 3, 200
	const maxDelay = 20 * time.Millisecond
	type run struct {
		name string
		ref  *models.Network
		p    *stagetest.Pipeline
		err  error
		took time.Duration
	}
	var runs []*run
	for _, M := range []int{2, 3, 5} {
		for _, sched := range pipeline.Schedules() {
			j := stagetest.NewJob("mlp", 2*M, uint64(M))
			ref, _ := stagetest.Reference(t, j, M, steps)
			wrap := func(s int, prev, next stage.Link) (stage.Link, stage.Link) {
				seed := uint64(1000*s + 10*M + len(sched))
				return stagetest.Jitter(prev, 2*seed, maxDelay), stagetest.Jitter(next, 2*seed+1, maxDelay)
			}
			runs = append(runs, &run{name: fmt.Sprintf("M=%d/%s", M, sched), ref: ref, p: newPipeline(t, j, sched, S, M, 0, wrap, stage.Cost{})})
		}
	}
	// A bound for a hang, not a speed check: the cases take about a
	// minute side by side; a deadlock would block until this deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() { // owned by this test: it waits for every case
			start := time.Now()
			defer func() { r.took = time.Since(start) }()
			for step := range steps {
				if _, errs := r.p.Step(ctx, int64(step)); errors.Join(errs...) != nil {
					r.err = fmt.Errorf("step %d: %w", step, errors.Join(errs...))
					return
				}
				r.p.SGD()
			}
			if err := r.p.CompareState(r.ref); err != nil {
				r.err = fmt.Errorf("after %d steps: %w", steps, err)
			}
		})
	}
	wg.Wait()
	for _, r := range runs {
		t.Logf("%s: %d steps in %.1fs", r.name, steps, r.took.Seconds())
		if r.err != nil {
			t.Errorf("%s: %v", r.name, r.err)
		}
	}
}
