package peerrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

func links(c *cluster) (prev, next []stage.Link) {
	for s := range c.prev {
		var p, n stage.Link
		if c.prev[s] != nil {
			p = c.prev[s]
		}
		if c.next[s] != nil {
			n = c.next[s]
		}
		prev, next = append(prev, p), append(next, n)
	}
	return prev, next
}

// Over gRPC streams, stages train and evaluate exactly as one worker:
// the stage package's suite, for both schedules and M < S, M = S, M > S.
func TestEquivalentOverGRPC(t *testing.T) {
	const steps = 3
	for _, c := range []struct {
		arch string
		S, M int
	}{{"mlp", 3, 2}, {"mlp", 3, 3}, {"mlp", 2, 5}, {"resnet8", 4, 4}, {"lenet5", 4, 9}} {
		for _, sched := range pipeline.Schedules() {
			t.Run(fmt.Sprintf("%s/S=%d/M=%d/%s", c.arch, c.S, c.M, sched), func(t *testing.T) {
				j := stagetest.NewJob(c.arch, 2*c.M, uint64(c.S+c.M))
				ref, losses := stagetest.Reference(t, j, c.M, steps)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cl := connect(ctx, t, "job-1", 3, c.S)
				defer cl.close()
				plan, err := pipeline.New(sched, c.S, c.M)
				if err != nil {
					t.Fatal(err)
				}
				prev, next := links(cl)
				p := stagetest.New(t, j, plan, prev, next, stage.Cost{})
				for step := range steps {
					stats, errs := p.Step(ctx, int64(step))
					if err := errors.Join(errs...); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if stats[c.S-1].Loss != losses[step] {
						t.Errorf("step %d: loss %v, want %v", step, stats[c.S-1].Loss, losses[step])
					}
					if step == steps-1 {
						if err := p.CompareGrads(ref); err != nil {
							t.Fatal(err)
						}
					}
					p.SGD()
				}
				if err := p.CompareState(ref); err != nil {
					t.Error(err)
				}
				// Evaluation through the same links, the last micro-batch short.
				n := j.Batch - 1
				got, errs := p.Infer(ctx, 0, n)
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if err := stagetest.SameBits(got, stagetest.ReferenceInfer(ref, j, n, j.Batch/c.M)); err != nil {
					t.Errorf("evaluation logits: %v", err)
				}
			})
		}
	}
}

// A tensor larger than a frame goes as several frames and arrives whole,
// both ways, and empty-shaped tensors as one empty frame.
func TestLinkCarriesLargeTensors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := connect(ctx, t, "j", 1, 2)
	defer cl.close()
	for i, shape := range [][2]int{{3, peerrpc.FrameElems}, {1, 2*peerrpc.FrameElems + 7}, {5, 1}, {0, 4}} {
		data := make([]float32, shape[0]*shape[1])
		for k := range data {
			data[k] = float32(k%1000) - 0.5
		}
		for _, dir := range []stage.Direction{stage.Activation, stage.Gradient} {
			from, to := stage.Link(cl.next[0]), stage.Link(cl.prev[1])
			if dir == stage.Gradient {
				from, to = to, from
			}
			h := stage.Header{Step: int64(i), MicroBatch: i, Dir: dir, Shape: shape}
			got := make([]float32, len(data))
			var wg sync.WaitGroup
			var serr error
			wg.Go(func() { serr = from.Send(ctx, h, data) })
			rerr := to.Recv(ctx, h, got)
			wg.Wait()
			if serr != nil || rerr != nil {
				t.Fatalf("%v: send %v, receive %v", h, serr, rerr)
			}
			if err := stagetest.SameBits(got, data); err != nil {
				t.Fatalf("%v: %v", h, err)
			}
		}
	}
}

// A stage whose worker dies mid-step makes every other stage fail before
// the deadline naming it; nothing hangs and no goroutine is left.
func TestPeerDiesOverGRPC(t *testing.T) {
	const S, M = 4, 4
	j := stagetest.NewJob("lenet5", 2*M, 3)
	for _, sched := range pipeline.Schedules() {
		for dead := range S {
			for _, k := range []int{0, M - 1} {
				t.Run(fmt.Sprintf("%s/dead=%d/k=%d", sched, dead, k), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					cl := connect(ctx, t, "job-2", 1, S)
					defer cl.close()
					plan, _ := pipeline.New(sched, S, M)
					prev, next := links(cl)
					kill := &stagetest.Tripwire{K: k, Fire: func() {
						// Its process's connections all go: to the next stage and from the previous one.
						if dead < S-1 {
							cl.conns[dead].Close()
						}
						cl.workers[dead].stop()
					}}
					prev[dead], next[dead] = kill.Wrap(prev[dead]), kill.Wrap(next[dead])
					p := stagetest.New(t, j, plan, prev, next, stage.Cost{})
					_, errs := p.Step(ctx, 0)
					for s, err := range errs {
						if s == dead {
							continue
						}
						var pe *stage.PeerError
						switch {
						case err == nil:
							t.Errorf("stage %d finished its step", s)
						case errors.Is(err, context.DeadlineExceeded):
							t.Errorf("stage %d waited for the deadline: %v", s, err)
						case !errors.As(err, &pe):
							t.Errorf("stage %d: %v has no *PeerError", s, err)
						case (s == dead-1 || s == dead+1) && pe.Stage != dead:
							t.Errorf("stage %d, a neighbour of dead stage %d, blames stage %d: %v", s, dead, pe.Stage, err)
						case !strings.Contains(err.Error(), fmt.Sprintf("stage %d: peer gone", dead)):
							t.Errorf("stage %d: %q does not name dead stage %d", s, err, dead)
						}
					}
				})
			}
		}
	}
}

// With random delays on every link end, over gRPC, both schedules finish
// every step for M < S, M = S and M > S and train exactly as one worker.
func TestRandomDelaysOverGRPC(t *testing.T) {
	const S, steps = 3, 8
	for _, M := range []int{2, 3, 5} {
		j := stagetest.NewJob("mlp", 2*M, uint64(M))
		ref, _ := stagetest.Reference(t, j, M, steps)
		for _, sched := range pipeline.Schedules() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cl := connect(ctx, t, "job-3", 1, S)
			plan, _ := pipeline.New(sched, S, M)
			prev, next := links(cl)
			for s := range S {
				prev[s], next[s] = stagetest.Jitter(prev[s], uint64(2*s), time.Millisecond), stagetest.Jitter(next[s], uint64(2*s+1), time.Millisecond)
			}
			p := stagetest.New(t, j, plan, prev, next, stage.Cost{})
			for step := range steps {
				if _, errs := p.Step(ctx, int64(step)); errors.Join(errs...) != nil {
					t.Fatalf("M=%d %s step %d: %v", M, sched, step, errors.Join(errs...))
				}
				p.SGD()
			}
			if err := p.CompareState(ref); err != nil {
				t.Errorf("M=%d %s: %v", M, sched, err)
			}
			cl.close()
			cancel()
		}
	}
}
