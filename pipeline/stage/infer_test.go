package stage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// Evaluation through the pipeline gives, bit for bit, the logits of one
// network evaluating the same micro-batches, after training steps too
// (batch norm's running statistics, dropout off), for a number of
// samples that is not a multiple of the micro-batch; training steps
// after it go on as if it had not run.
func TestInfer(t *testing.T) {
	const steps = 2
	for _, c := range []struct {
		arch string
		S, M int
	}{{"mlp", 3, 2}, {"cnn", 4, 4}, {"resnet8", 4, 3}} {
		for _, sched := range pipeline.Schedules() {
			t.Run(fmt.Sprintf("%s/S=%d/M=%d/%s", c.arch, c.S, c.M, sched), func(t *testing.T) {
				j := stagetest.NewJob(c.arch, 2*c.M, 11)
				ref, _ := stagetest.Reference(t, j, c.M, steps)
				p := newPipeline(t, j, sched, c.S, c.M, 1, nil, stage.Cost{})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				n := j.Batch - 1 // the last micro-batch one sample short
				for step := range steps {
					if _, errs := p.Infer(ctx, int64(step), n); errors.Join(errs...) != nil {
						t.Fatal(errors.Join(errs...))
					}
					if _, errs := p.Step(ctx, int64(step)); errors.Join(errs...) != nil {
						t.Fatal(errors.Join(errs...))
					}
					p.SGD()
				}
				if err := p.CompareState(ref); err != nil {
					t.Fatalf("after steps with evaluations between them: %v", err)
				}
				got, errs := p.Infer(ctx, steps, n)
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if err := stagetest.SameBits(got, stagetest.ReferenceInfer(ref, j, n, j.Batch/c.M)); err != nil {
					t.Errorf("logits: %v", err)
				}
			})
		}
	}
}

// An evaluation's activation is not a training step's: a stage that
// trains while its neighbour evaluates refuses the message, and the
// evaluating stage fails too (its third micro-batch waits on a link that
// holds one message, the second, which no one takes).
func TestInferRefusedByATrainingStage(t *testing.T) {
	j := stagetest.NewJob("mlp", 4, 2)
	x := stagetest.NewJob("mlp", 6, 2).X
	p := newPipeline(t, j, pipeline.ScheduleGPipe, 2, 2, 1, nil, stage.Cost{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		errs[0] = p.Execs[0].Infer(ctx, 0, 6, x, nil)
	}()
	_, errs[1] = p.Execs[1].Step(ctx, 0, stage.Input{Loss: func(int, []float32, []float32) float32 { return 0 }})
	<-done
	var he *stage.HeaderError
	if !errors.As(errs[1], &he) || !strings.Contains(errs[1].Error(), "got the activation of micro-batch 0 of evaluation 0") {
		t.Errorf("training stage: %v", errs[1])
	}
	if errs[0] == nil {
		t.Error("the evaluating stage finished")
	}
}
