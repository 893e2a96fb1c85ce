package stage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
)

// A pipeline step gives, bit for bit, the gradients, batch-norm
// statistics and loss of one worker accumulating gradients over the same
// micro-batches, and after SGD the same parameters, for every schedule,
// 2 and 4 stages (where the model has the blocks), and M = 1, S and 2S+1
// micro-batches, over rendezvous and buffered links. Two steps, so that
// the second runs on updated parameters and later dropout masks.
func TestEquivalentToOneWorker(t *testing.T) {
	const steps = 2
	for _, arch := range []string{"mlp", "lenet5", "cnn", "resnet8"} {
		for _, S := range []int{2, 4} {
			for _, M := range []int{1, S, 2*S + 1} {
				for _, sched := range pipeline.Schedules() {
					name := fmt.Sprintf("%s/S=%d/M=%d/%s", arch, S, M, sched)
					t.Run(name, func(t *testing.T) {
						j := newJob(arch, 2*M, uint64(S*100+M))
						if S > len(j.net(t).Blocks()) {
							t.Skipf("%s has %d blocks", arch, len(j.net(t).Blocks()))
						}
						ref, losses := reference(t, j, M, steps)
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						p := newPipeline(t, j, sched, S, M, (S+M)%3, nil, stage.Cost{})
						for step := range steps {
							stats, errs := p.step(ctx, int64(step))
							for s, err := range errs {
								if err != nil {
									t.Fatalf("step %d stage %d: %v", step, s, err)
								}
							}
							if got := stats[S-1].Loss; got != losses[step] {
								t.Errorf("step %d: loss %v, want %v", step, got, losses[step])
							}
							for s, st := range stats {
								if want := peakWant(sched, S, M, s); st.PeakInFlight != want {
									t.Errorf("step %d stage %d: %d micro-batches in flight at most, want %d", step, s, st.PeakInFlight, want)
								}
							}
							if step == steps-1 {
								// The last step's gradients (the reference keeps only its last).
								for s, n := range p.nets {
									st := p.stages[s][s]
									lo, hi := st.ParamOffset, st.ParamOffset+st.ParamLen
									if err := sameBits(n.Grads()[lo:hi], ref.Grads()[lo:hi]); err != nil {
										t.Fatalf("stage %d gradients: %v", s, err)
									}
								}
							}
							p.sgd()
						}
						for s, n := range p.nets {
							st := p.stages[s][s]
							lo, hi := st.ParamOffset, st.ParamOffset+st.ParamLen
							if err := sameBits(n.Params()[lo:hi], ref.Params()[lo:hi]); err != nil {
								t.Errorf("stage %d parameters: %v", s, err)
							}
							blo, bhi := st.BufferOffset, st.BufferOffset+st.BufferLen
							if err := sameBits(n.Buffers()[blo:bhi], ref.Buffers()[blo:bhi]); err != nil {
								t.Errorf("stage %d buffers: %v", s, err)
							}
						}
					})
				}
			}
		}
	}
}

// peakWant is the plan's bound on micro-batches in flight on stage s:
// M under GPipe, min(M, S−s) under 1F1B.
func peakWant(sched pipeline.Schedule, S, M, s int) int {
	if sched == pipeline.ScheduleGPipe {
		return M
	}
	return min(M, S-s)
}
