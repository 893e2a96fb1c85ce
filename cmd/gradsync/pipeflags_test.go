package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spf13/cobra"
)

// The pipeline flags fill parallelism over the job file's, and leave it
// unset when none is given.
func TestPipelineFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("model: lenet5\nparallelism: {pipeline: {stages: 4, schedule: gpipe}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"-f", file, "--pipeline-stages", "2", "--micro-batches", "8", "--data-parallel", "3",
		"--pipeline-boundaries", "3", "--pipeline-balance", "time", "--debug-stage-cost", "fwd=1ms"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	p := spec.GetParallelism()
	if p.GetData() != 3 || p.GetPipeline().GetStages() != 2 || p.GetPipeline().GetMicroBatches() != 8 ||
		p.GetPipeline().GetSchedule() != "gpipe" || !slices.Equal(p.GetPipeline().GetBoundaries(), []string{"3"}) ||
		p.GetPipeline().GetDebugStageCost() != "fwd=1ms" || p.GetPipeline().GetBalance() != "time" || defaultWorkers(spec) != 6 {
		t.Errorf("parallelism %v", p)
	}
	var plain specFlags
	c = &cobra.Command{Use: "x"}
	plain.register(c)
	if err := c.ParseFlags([]string{"--schedule", "1f1b"}); err != nil {
		t.Fatal(err)
	}
	if spec, err = plain.build(c); err != nil || spec.GetParallelism().GetPipeline().GetSchedule() != "1f1b" {
		t.Errorf("--schedule alone: %v %v", spec, err)
	}
	plain = specFlags{}
	c = &cobra.Command{Use: "x"}
	plain.register(c)
	if spec, err = plain.build(c); err != nil || spec.Parallelism != nil || defaultWorkers(spec) != 1 {
		t.Errorf("no pipeline flags: %v %v", spec, err)
	}
}
