package stage_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// benchStep runs b.N pipeline steps and reports, besides the time per
// step, the measured idle fraction of the stages (mean over stages of
// (makespan − busy)/makespan, the makespan from starting every stage to
// the last one's end) next to Simulate's prediction for the same costs.
func benchStep(b *testing.B, j stagetest.Job, sched pipeline.Schedule, S, M int, cost stage.Cost) {
	p := newPipeline(b, j, sched, S, M, 1, nil, cost)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var idle float64
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		stats, errs := p.Step(ctx, int64(i))
		span := time.Since(t0)
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
		for _, st := range stats {
			idle += float64(span-st.Busy) / float64(span) / float64(S)
		}
	}
	b.ReportMetric(idle/float64(b.N), "idle")
	if cost != (stage.Cost{}) {
		plan, _ := pipeline.New(sched, S, M)
		r, err := pipeline.Simulate(plan, pipeline.SimConfig{Forward: int64(cost.Forward), Backward: int64(cost.Backward)})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Idle(0))/float64(r.Makespan), "idle-sim")
	}
}

// The bubble with a synthetic cost per micro-batch (5 ms forward, 10 ms
// backward: sleeping, so the machine's load hardly matters), S = 4 and
// M = 4, 8, 16 (lenet5, one sample per micro-batch, whose compute is
// well under the cost): measured against (S−1)/(M+S−1).
func BenchmarkBubble(b *testing.B) {
	cost := stage.Cost{Forward: 5 * time.Millisecond, Backward: 10 * time.Millisecond}
	for _, sched := range pipeline.Schedules() {
		for _, M := range []int{4, 8, 16} {
			b.Run(fmt.Sprintf("%s/S=4/M=%d", sched, M), func(b *testing.B) {
				benchStep(b, stagetest.NewJob("lenet5", M, 1), sched, 4, M, cost)
			})
		}
	}
}

// A step with real compute: one worker (gradient accumulation over M
// micro-batches) against S = 2 and 4 stages in process, resnet8 on
// 16×16 inputs, batch 32, M = 8. On a machine with fewer cores than
// stages the stages share the cores: this shows the overhead, not a
// speed-up.
func BenchmarkStep(b *testing.B) {
	const batch, M = 32, 8
	j := stagetest.NewJob("resnet8", batch, 1)
	b.Run("one-worker", func(b *testing.B) {
		net := j.Net(b)
		classes, in, k := j.Opt.Classes, net.InputSize(), batch/M
		dl := make([]float32, k*classes)
		b.ReportAllocs()
		for b.Loop() {
			net.ZeroGrad()
			for lo := 0; lo < batch; lo += k {
				logits := net.Forward(j.X[lo*in:(lo+k)*in], k, true)
				models.SoftmaxCrossEntropy(logits, j.Labels[lo:lo+k], classes, dl)
				net.Backward(dl)
			}
		}
	})
	for _, S := range []int{2, 4} {
		for _, sched := range pipeline.Schedules() {
			b.Run(fmt.Sprintf("%s/S=%d/M=%d", sched, S, M), func(b *testing.B) {
				benchStep(b, j, sched, S, M, stage.Cost{})
			})
		}
	}
}
