package stage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
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
						if testing.Short() && arch != "mlp" && M != S {
							t.Skip("-short: M = S only beyond mlp")
						}
						j := stagetest.NewJob(arch, 2*M, uint64(S*100+M))
						if nb := len(j.Net(t).Blocks()); S > nb {
							t.Skipf("%s has %d blocks", arch, nb)
						}
						ref, losses := stagetest.Reference(t, j, M, steps)
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						p := newPipeline(t, j, sched, S, M, (S+M)%3, nil, stage.Cost{})
						for step := range steps {
							stats, errs := p.Step(ctx, int64(step))
							for s, err := range errs {
								if err != nil {
									t.Fatalf("step %d stage %d: %v", step, s, err)
								}
							}
							if got := stats[S-1].Loss; got != losses[step] {
								t.Errorf("step %d: loss %v, want %v", step, got, losses[step])
							}
							for s, st := range stats {
								if want := peakWant(sched, S, M, s); st.PeakInFlight != want || p.Execs[s].Slots() != want {
									t.Errorf("step %d stage %d: %d micro-batches in flight at most (%d slots), want %d", step, s, st.PeakInFlight, p.Execs[s].Slots(), want)
								}
								// What one stage sends the next receives, M tensors each way.
								in, out := p.Execs[s].InShape(), p.Execs[s].OutShape()
								wantIn, wantOut := int64(4*M*in[0]*in[1]), int64(4*M*out[0]*out[1])
								if s == 0 {
									wantIn = 0
								}
								if s == S-1 {
									wantOut = 0
								}
								if st.BytesFromPrev != wantIn || st.BytesToPrev != wantIn || st.BytesToNext != wantOut || st.BytesFromNext != wantOut {
									t.Errorf("step %d stage %d: bytes from/to prev %d/%d, to/from next %d/%d; want %d, %d", step, s,
										st.BytesFromPrev, st.BytesToPrev, st.BytesToNext, st.BytesFromNext, wantIn, wantOut)
								}
								if s > 0 && st.BytesFromPrev != stats[s-1].BytesToNext {
									t.Errorf("step %d: stage %d received %d bytes, stage %d sent %d", step, s, st.BytesFromPrev, s-1, stats[s-1].BytesToNext)
								}
							}
							if step == steps-1 {
								// The reference holds its last step's gradients.
								if err := p.CompareGrads(ref); err != nil {
									t.Fatal(err)
								}
							}
							p.SGD()
						}
						if err := p.CompareState(ref); err != nil {
							t.Error(err)
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
