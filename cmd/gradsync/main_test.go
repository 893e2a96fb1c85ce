package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -12345: "-12,345"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

// The last --json line of local/submit --watch is the summary object with
// the fields the README promises.
func TestSummaryJSON(t *testing.T) {
	var b bytes.Buffer
	p := &printer{out: &b, json: true}
	p.summary(&pb.Job{Id: "job-1", State: pb.JobState_JOB_STATE_SUCCEEDED, RunDir: "/r",
		Spec:   &pb.JobSpec{Model: "mlp", Mode: "ps", Workers: proto.Int32(2), Dataset: &pb.DatasetSpec{Name: "mnist"}},
		Result: &pb.JobResult{TestAccuracy: 0.97, Epochs: 1, WallSeconds: 3}})
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"job_id", "state", "test_accuracy", "epochs", "workers", "mode", "wall_seconds", "run_dir"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary lacks %q: %s", k, b.String())
		}
	}
	if m["state"] != "SUCCEEDED" || m["workers"] != 2.0 {
		t.Errorf("summary %s", b.String())
	}
}

// Flags override the job file; unset flags leave its fields alone.
func TestSpecFlagsOverrideFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("model: lenet5\nworkers: 3\nepochs: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"-f", file, "--workers", "4", "--lr", "0.1"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	if spec.GetModel() != "lenet5" || spec.GetWorkers() != 4 || spec.GetEpochs() != 2 || spec.GetOptimizer().GetLr() != 0.1 {
		t.Errorf("spec %v", spec)
	}
	if spec.BatchSize != nil || spec.Optimizer.Momentum != nil || spec.Precision != "" || spec.ActivationCheckpointing != "" {
		t.Errorf("unset flags wrote fields: %v", spec)
	}
}

// --precision and --activation-checkpointing set JobSpec 31 and 30 over
// the job file's, and jobspec judges them.
func TestSpecFlagsEngine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("model: resnet8\nmode: ring\nprecision: bf16\nactivation_checkpointing: sqrt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args       []string
		prec, ckpt string
	}{
		{nil, "bf16", "sqrt"},
		{[]string{"--precision", "fp16", "--activation-checkpointing", "blocks"}, "fp16", "blocks"},
		{[]string{"--precision", "fp32"}, "fp32", "sqrt"},
	} {
		var sf specFlags
		c := &cobra.Command{Use: "x"}
		sf.register(c)
		if err := c.ParseFlags(append([]string{"-f", file}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		spec, err := sf.build(c)
		if err != nil {
			t.Fatal(err)
		}
		if spec.Precision != tc.prec || spec.ActivationCheckpointing != tc.ckpt {
			t.Errorf("%v: precision %q, checkpointing %q; want %q, %q", tc.args, spec.Precision, spec.ActivationCheckpointing, tc.prec, tc.ckpt)
		}
		if _, err := jobspec.Normalize(spec, nil); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"--precision", "fp8", "--activation-checkpointing", "all"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobspec.Normalize(spec, nil); err == nil {
		t.Errorf("--precision fp8 --activation-checkpointing all: accepted")
	}
}

// The dataset flags fill the dataset fields, and build reads a streamed
// data set's shape from the data (the submitting client's half).
func TestSpecFlagsDataset(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 4, 2, 1); err != nil {
		t.Fatal(err)
	}
	var sf specFlags
	c := &cobra.Command{Use: "x"}
	sf.register(c)
	if err := c.ParseFlags([]string{"--dataset", "cifar100", "--data-dir", dir, "--label-granularity", "coarse",
		"--augment", "crop-flip", "--cache-mb", "0", "--mean", "0.5,0.4,0.3", "--std", "0.2,0.2,0.2", "--color-jitter", "0.4,0.3,0.2"}); err != nil {
		t.Fatal(err)
	}
	spec, err := sf.build(c)
	if err != nil {
		t.Fatal(err)
	}
	d := spec.Dataset
	if d.LabelGranularity != "coarse" || d.Augment != "crop-flip" || d.CacheMb == nil || *d.CacheMb != 0 || len(d.Mean) != 3 || d.Std[2] != 0.2 {
		t.Errorf("dataset %v", d)
	}
	if d.JitterBrightness != 0.4 || d.JitterContrast != 0.3 || d.JitterSaturation != 0.2 {
		t.Errorf("--color-jitter 0.4,0.3,0.2: %v, %v, %v", d.JitterBrightness, d.JitterContrast, d.JitterSaturation)
	}
	if d.JitterHue != 0 {
		t.Errorf("--color-jitter with three values: hue %v, want 0", d.JitterHue)
	}
	jitter := func(v string) (*pb.JobSpec, error) {
		var f specFlags
		c := &cobra.Command{Use: "x"}
		f.register(c)
		if err := c.ParseFlags([]string{"--dataset", "cifar100", "--data-dir", dir, "--color-jitter", v}); err != nil {
			t.Fatal(err)
		}
		return f.build(c)
	}
	for _, v := range []string{"0.4,0.3", "0.4,0.3,0.2,0.1,0"} {
		if _, err := jitter(v); err == nil || !strings.Contains(err.Error(), "three or four values") {
			t.Errorf("--color-jitter %s: %v", v, err)
		}
	}
	if s4, err := jitter("0.4,0.3,0.2,0.1"); err != nil {
		t.Errorf("--color-jitter with four values: %v", err)
	} else if d4 := s4.Dataset; d4.JitterBrightness != 0.4 || d4.JitterSaturation != 0.2 || d4.JitterHue != 0.1 {
		t.Errorf("--color-jitter 0.4,0.3,0.2,0.1: %v, %v, %v, hue %v", d4.JitterBrightness, d4.JitterContrast, d4.JitterSaturation, d4.JitterHue)
	}
	if sh := d.Shape; sh.GetClasses() != 20 || sh.GetChannels() != 3 || sh.GetHeight() != 32 {
		t.Errorf("shape %v, want 3×32×32 with 20 classes", sh)
	}
	for v, want := range map[string][2]int32{"32x24": {32, 24}, "64": {64, 64}, "7X9": {7, 9}} {
		if h, w, err := parseImageSize(v); err != nil || h != want[0] || w != want[1] {
			t.Errorf("--image-size %s: %d, %d, %v", v, h, w, err)
		}
	}
	for _, v := range []string{"", "0x4", "ax4", "4x"} {
		if _, _, err := parseImageSize(v); err == nil {
			t.Errorf("--image-size %q accepted", v)
		}
	}
	var bad specFlags
	c = &cobra.Command{Use: "x"}
	bad.register(c)
	if err := c.ParseFlags([]string{"--dataset", "imagefolder", "--data-dir", filepath.Join(dir, "missing")}); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.build(c); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing folder: %v; want an error naming it", err)
	}
}
