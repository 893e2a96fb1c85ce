package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

// --label-shards fills parallelism over the job file's (its label
// groups kept), and local's default worker count is data × label shards.
func TestLabelShardFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("model: cnn\nparallelism: {data: 2, label_shards: 5, label_groups: [{classes: [0, 1]}, {classes: [2, 3, 4, 5, 6, 7, 8, 9]}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"-f", file, "--label-shards", "2"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	p := spec.GetParallelism()
	if p.GetLabelShards() != 2 || p.GetData() != 2 || len(p.GetLabelGroups()) != 2 || defaultWorkers(spec) != 4 {
		t.Errorf("parallelism %v, default workers %d", p, defaultWorkers(spec))
	}
}

func TestTensorParallelFlag(t *testing.T) {
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"--model", "mlp", "--tensor-parallel", "2", "--data-parallel", "3"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	if p := spec.GetParallelism(); p.GetTensor() != 2 || p.GetLabelShards() != 0 || defaultWorkers(spec) != 6 {
		t.Errorf("parallelism %v, default workers %d", p, defaultWorkers(spec))
	}
}
