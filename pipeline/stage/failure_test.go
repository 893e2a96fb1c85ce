package stage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// A stage that dies mid-step (before it has forwarded the last
// micro-batch) makes every other stage's step fail well before the
// deadline, with an error that names the dead stage: its neighbours'
// with a *PeerError for it, the others through the neighbours' aborts.
func TestPeerDiesMidStep(t *testing.T) {
	const S, M = 4, 5
	j := stagetest.NewJob("lenet5", 2*M, 9)
	for _, sched := range pipeline.Schedules() {
		for dead := range S {
			for _, k := range []int{0, M / 2, M - 1} {
				for _, capacity := range []int{0, 2} {
					if testing.Short() && (k == M/2 || capacity == 2) {
						continue
					}
					t.Run(fmt.Sprintf("%s/dead=%d/k=%d/cap=%d", sched, dead, k, capacity), func(t *testing.T) {
						wrap := func(s int, prev, next stage.Link) (stage.Link, stage.Link) {
							if s != dead {
								return prev, next
							}
							// It dies as a process does: its links go.
							kill := &stagetest.Tripwire{K: k, Fire: func() {
								for _, l := range []stage.Link{prev, next} {
									if l != nil {
										l.Abort(stagetest.ErrKilled)
									}
								}
							}}
							return kill.Wrap(prev), kill.Wrap(next)
						}
						p := newPipeline(t, j, sched, S, M, capacity, wrap, stage.Cost{})
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						_, errs := p.Step(ctx, 3)
						if !errors.Is(errs[dead], stagetest.ErrKilled) {
							t.Errorf("the dead stage returned %v", errs[dead])
						}
						for s, err := range errs {
							if s == dead {
								continue
							}
							var se *stage.StepError
							var pe *stage.PeerError
							switch {
							case err == nil:
								t.Errorf("stage %d finished its step", s)
							case errors.Is(err, context.DeadlineExceeded):
								t.Errorf("stage %d waited for the deadline: %v", s, err)
							case !errors.As(err, &se) || se.Stage != s || se.Step != 3 || !errors.As(err, &pe) || !errors.Is(err, stage.ErrPeerGone):
								t.Errorf("stage %d: %v is not a *StepError of step 3 with a *PeerError", s, err)
							case (s == dead-1 || s == dead+1) && pe.Stage != dead:
								t.Errorf("stage %d, a neighbour of dead stage %d, blames stage %d: %v", s, dead, pe.Stage, err)
							case !strings.Contains(err.Error(), fmt.Sprintf("stage %d: peer gone", dead)):
								t.Errorf("stage %d: %q does not name dead stage %d", s, err, dead)
							}
						}
						// A failed executor is not reused.
						if _, err := p.Execs[(dead+1)%S].Step(ctx, 4, stage.Input{}); err == nil || !strings.Contains(err.Error(), "not reusable") {
							t.Errorf("a second step after the failure: %v", err)
						}
					})
				}
			}
		}
	}
}

// A stage that never takes part (hung, not dead) makes its neighbours
// fail at the context's deadline, naming the stage they waited for; the
// stages beyond fail through their aborts, naming the neighbour.
func TestPeerHangsUntilDeadline(t *testing.T) {
	const S, M = 3, 2
	j := stagetest.NewJob("mlp", 2*M, 4)
	for _, sched := range pipeline.Schedules() {
		p := newPipeline(t, j, sched, S, M, 1, nil, stage.Cost{})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		errs := make([]error, S)
		var wg sync.WaitGroup
		for _, s := range []int{0, 2} { // stage 1 never runs
			in := stage.Input{X: j.X}
			if s == 2 {
				in = stage.Input{Loss: func(int, []float32, []float32) float32 { return 0 }}
			}
			wg.Go(func() { _, errs[s] = p.Execs[s].Step(ctx, 0, in) })
		}
		wg.Wait()
		cancel()
		for _, s := range []int{0, 2} {
			if !errors.Is(errs[s], context.DeadlineExceeded) || !strings.Contains(errs[s].Error(), "stage 1") {
				t.Errorf("%s: stage %d: %v, want a deadline naming stage 1", sched, s, errs[s])
			}
		}
	}
}

// tamper wraps a stage's next link and changes the header of its first
// activation.
type tamper struct {
	stage.Link
	f    func(*stage.Header)
	done bool
}

func (l *tamper) Send(ctx context.Context, h stage.Header, data []float32) error {
	if !l.done && h.Dir == stage.Activation {
		l.done = true
		l.f(&h)
	}
	return l.Link.Send(ctx, h, data)
}

// A message that is not the one the receiver's plan expects is refused
// with a *HeaderError saying what is wrong (Stale for an earlier step),
// and both sides' steps fail.
func TestWrongMessageRefused(t *testing.T) {
	const S, M = 2, 3
	j := stagetest.NewJob("mlp", 2*M, 5)
	for _, c := range []struct {
		name  string
		f     func(*stage.Header)
		stale bool
		msg   string
	}{
		{"earlier step", func(h *stage.Header) { h.Step-- }, true, "want step 7"},
		{"later step", func(h *stage.Header) { h.Step++ }, false, "want step 7"},
		{"micro-batch", func(h *stage.Header) { h.MicroBatch = 2 }, false, "micro-batch 2 of step 7, shape 2×256, want micro-batch 0"},
		{"shape", func(h *stage.Header) { h.Shape = [2]int{h.Shape[1], h.Shape[0]} }, false, "shape 256×2, want shape 2×256"},
		{"direction", func(h *stage.Header) { h.Dir = stage.Gradient }, false, "got an gradient, want the activation"},
	} {
		for _, sched := range pipeline.Schedules() {
			wrap := func(s int, prev, next stage.Link) (stage.Link, stage.Link) {
				if s == 0 {
					next = &tamper{Link: next, f: c.f}
				}
				return prev, next
			}
			p := newPipeline(t, j, sched, S, M, 1, wrap, stage.Cost{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, errs := p.Step(ctx, 7)
			cancel()
			var he *stage.HeaderError
			if !errors.As(errs[1], &he) || he.Stale != c.stale || !strings.Contains(he.Error(), c.msg) {
				t.Errorf("%s %s: stage 1: %v, want a HeaderError (stale %v) saying %q", c.name, sched, errs[1], c.stale, c.msg)
			}
			if errs[0] == nil || errors.Is(errs[0], context.DeadlineExceeded) {
				t.Errorf("%s %s: stage 0: %v", c.name, sched, errs[0])
			}
		}
	}
}

// With random delays on every link end, both schedules finish every step
// for M < S, M = S and M > S, over rendezvous and buffered links, and
// train exactly as one worker does.
func TestRandomDelays(t *testing.T) {
	const S, steps = 3, 12
	for _, M := range []int{2, 3, 5} {
		j := stagetest.NewJob("mlp", 2*M, uint64(M))
		ref, _ := stagetest.Reference(t, j, M, steps)
		for _, sched := range pipeline.Schedules() {
			for _, capacity := range []int{0, 1} {
				wrap := func(s int, prev, next stage.Link) (stage.Link, stage.Link) {
					seed := uint64(100*s + 10*M + capacity)
					return stagetest.Jitter(prev, 2*seed, time.Millisecond), stagetest.Jitter(next, 2*seed+1, time.Millisecond)
				}
				p := newPipeline(t, j, sched, S, M, capacity, wrap, stage.Cost{})
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				for step := range steps {
					if _, errs := p.Step(ctx, int64(step)); errors.Join(errs...) != nil {
						cancel()
						t.Fatalf("M=%d %s cap %d step %d: %v", M, sched, capacity, step, errors.Join(errs...))
					}
					p.SGD()
				}
				cancel()
				if err := p.CompareState(ref); err != nil {
					t.Errorf("M=%d %s cap %d, after %d steps: %v", M, sched, capacity, steps, err)
				}
			}
		}
	}
}
