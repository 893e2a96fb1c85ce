package stage_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// New refuses a configuration that cannot run, saying what is wrong.
func TestNewRefuses(t *testing.T) {
	j := stagetest.NewJob("mlp", 4, 1)
	net := j.Net(t)
	parts, err := models.Partition(net, 2, models.Balance{})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := models.Partition(stagetest.NewJob("lenet5", 4, 1).Net(t), 2, models.Balance{})
	plan, _ := pipeline.GPipe(2, 2)
	next, prev := stage.Pipe(0, 1)
	good := stage.Config{Net: net, Stages: parts, Stage: 0, Plan: plan, Batch: 4, Next: next}
	broken := plan
	broken.Actions = [][]pipeline.Action{plan.Actions[0], plan.Actions[0]}
	swapped := []models.Stage{parts[1], parts[0]}
	for _, c := range []struct {
		name string
		edit func(*stage.Config)
		msg  string
	}{
		{"no network", func(c *stage.Config) { c.Net = nil }, "Config.Net is nil"},
		{"invalid plan", func(c *stage.Config) { c.Plan = broken }, "pipeline: stage 1"},
		{"stage count", func(c *stage.Config) { c.Stages = parts[:1] }, "1 model stages for a plan of 2 stages"},
		{"stage index", func(c *stage.Config) { c.Stage = 2 }, "stage 2 out of [0, 2)"},
		{"not a partition", func(c *stage.Config) { c.Stages = swapped }, "stage 0 is not a stage of mlp's partition (models.Partition): its block 0 is"},
		{"another network's partition", func(c *stage.Config) { c.Stages = other }, "stage 0 is not a stage of mlp's partition"},
		{"missing blocks", func(c *stage.Config) { c.Stages = []models.Stage{parts[0], parts[0]} }, "stage 1 is not a stage of mlp's partition"},
		{"edited range", func(c *stage.Config) {
			st := slices.Clone(parts)
			st[1].End++
			c.Stages = st
		}, "stage 1 is not a stage of mlp's partition (models.Partition): its ranges are not its blocks'"},
		{"batch", func(c *stage.Config) { c.Batch = 5 }, "batch 5 is not a positive multiple of 2 micro-batches"},
		{"small batch", func(c *stage.Config) { c.Batch = 1 }, "batch 1 is not a positive multiple"},
		{"missing link", func(c *stage.Config) { c.Next = nil }, "want a Prev link exactly when it is not the first stage and a Next link exactly when it is not the last"},
		{"extra link", func(c *stage.Config) { c.Prev = prev }, "has Prev true and Next true"},
	} {
		cfg := good
		c.edit(&cfg)
		if _, err := stage.New(cfg); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want …%s…", c.name, err, c.msg)
		}
	}
	if _, err := stage.New(good); err != nil {
		t.Errorf("the good configuration: %v", err)
	}
}

// A step without the input it needs fails with a *StepError saying so,
// and aborts its links.
func TestStepRefusesMissingInput(t *testing.T) {
	j := stagetest.NewJob("mlp", 4, 1)
	plan, _ := pipeline.GPipe(2, 2)
	for _, c := range []struct {
		stage int
		in    stage.Input
		msg   string
	}{
		{0, stage.Input{X: j.X[:10]}, "input of 10 values, want batch 4 × 144"},
		{1, stage.Input{}, "the last stage needs Input.Loss"},
	} {
		net := j.Net(t)
		parts, _ := models.Partition(net, 2, models.Balance{})
		next, prev := stage.Pipe(0, 1)
		cfg := stage.Config{Net: net, Stages: parts, Stage: c.stage, Plan: plan, Batch: 4, Next: next}
		if c.stage == 1 {
			cfg.Next, cfg.Prev = nil, prev
		}
		e, err := stage.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Step(t.Context(), 0, c.in)
		var se *stage.StepError
		if !errors.As(err, &se) || se.Stage != c.stage || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("stage %d: %v, want a StepError saying %q", c.stage, err, c.msg)
		}
		peer := stage.Link(prev)
		if c.stage == 1 {
			peer = next
		}
		if err := peer.Send(t.Context(), stage.Header{Dir: stage.Activation, Shape: [2]int{1, 1}}, []float32{0}); !errors.Is(err, stage.ErrPeerGone) {
			t.Errorf("stage %d's peer after the failure: %v", c.stage, err)
		}
	}
}
