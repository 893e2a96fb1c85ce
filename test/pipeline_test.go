package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// pipeResult is what TestPipelineMatchesGradAccum reads of a local run's
// summary.
type pipeResult struct {
	State        string  `json:"state"`
	Message      string  `json:"message"`
	Steps        int64   `json:"steps"`
	TestAccuracy float64 `json:"test_accuracy"`
	Checksum     string  `json:"parameter_checksum"`
}

func runLocal(t *testing.T, args ...string) pipeResult {
	t.Helper()
	ctx := testCtx(t, 3*time.Minute)
	base := []string{"local", "--json", "--model", "lenet5", "--dataset", "synthetic", "--max-steps", "20", "--seed", "5",
		"--runs-dir", t.TempDir()}
	out, code := gradsync(ctx, t, append(base, args...)...)
	if code != 0 || len(out) == 0 {
		t.Fatalf("gradsync local %v: exit %d, output %v", args, code, out)
	}
	var r pipeResult
	if err := json.Unmarshal([]byte(out[len(out)-1]), &r); err != nil || r.State != "SUCCEEDED" || r.Checksum == "" {
		t.Fatalf("gradsync local %v: last line %q (%v)", args, out[len(out)-1], err)
	}
	return r
}

// TestPipelineMatchesGradAccum runs lenet5 cut into 2 pipeline stages on
// 4 micro-batches of a 32-example step, under both schedules, and as 2
// data replicas of those 2 stages: each ends with the parameters, bit for
// bit (the summary's checksum of the whole model, gathered from the
// stages), and the test accuracy of the same job on 1 (or 2) whole-model
// ring workers accumulating 4 micro-batches of 8.
func TestPipelineMatchesGradAccum(t *testing.T) {
	for _, d := range []int{1, 2} {
		want := runLocal(t, "--mode", "ring", "--workers", fmt.Sprint(d), "--batch-size", "8", "--grad-accum", "4")
		for _, sched := range []string{"gpipe", "1f1b"} {
			if d == 2 && sched == "gpipe" {
				continue // one 2×2 run is enough on a loaded machine
			}
			got := runLocal(t, "--workers", fmt.Sprint(2*d), "--pipeline-stages", "2", "--micro-batches", "4",
				"--schedule", sched, "--batch-size", "32")
			if got.Checksum != want.Checksum || got.TestAccuracy != want.TestAccuracy || got.Steps != want.Steps {
				t.Errorf("D=%d S=2 M=4 %s: checksum %s, accuracy %v after %d steps; %d whole-model worker(s) with grad_accum 4: %s, %v after %d",
					d, sched, got.Checksum, got.TestAccuracy, got.Steps, d, want.Checksum, want.TestAccuracy, want.Steps)
			}
		}
	}
}

// TestPipelineCheckpointIsWholeModel checks that a 2-stage job's
// checkpoints are one whole model: model.safetensors (PyTorch names) and
// optim.safetensors of steps 10 and 20 are byte for byte those of the
// same job on one whole-model worker accumulating 4 micro-batches.
func TestPipelineCheckpointIsWholeModel(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	common := "model: lenet5\ndataset: {name: synthetic}\nmax_steps: 20\nseed: 5\nmode: ring\ncheckpoint: {every_steps: 10}\n"
	pipe := write("pipe.yaml", common+"batch_size: 32\nparallelism: {pipeline: {stages: 2, micro_batches: 4, schedule: gpipe}}\n")
	whole := write("whole.yaml", common+"batch_size: 8\ngrad_accum_steps: 4\n")
	runDir := func(workers, file string) string {
		ctx := testCtx(t, 3*time.Minute)
		out, code := gradsync(ctx, t, "local", "--json", "--workers", workers, "--file", file, "--runs-dir", filepath.Join(dir, "runs"))
		if code != 0 || len(out) == 0 {
			t.Fatalf("gradsync local %s: exit %d, output %v", file, code, out)
		}
		s := parseSummary(t, out)
		if s.State != "SUCCEEDED" {
			t.Fatalf("%s: %s %s", file, s.State, s.Message)
		}
		return s.RunDir
	}
	a, b := runDir("2", pipe), runDir("1", whole)
	for _, ck := range []string{"ckpt-10", "ckpt-20"} {
		for _, f := range []string{"model.safetensors", "optim.safetensors"} {
			x, err := os.ReadFile(filepath.Join(a, "checkpoints", ck, f))
			if err != nil {
				t.Fatal(err)
			}
			y, err := os.ReadFile(filepath.Join(b, "checkpoints", ck, f))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(x, y) {
				t.Errorf("%s/%s of the 2-stage job differs from the whole-model job's (%d and %d bytes)", ck, f, len(x), len(y))
			}
		}
	}
}

// TestKillPipelineStage kills -9 one stage's worker of a 2-stage job
// (D = 1): the job fails within 10 s naming that worker and its stage, and the
// survivor is free for the next job.
func TestKillPipelineStage(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	// The workers write their stages' summaries into their runs directory.
	worker := func(id string) *proc {
		p := start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id, "--runs-dir", filepath.Join(dir, "wruns")}, s.sec...)...)
		s.waitWorker(ctx, t, id, "IDLE")
		return p
	}
	worker("stage-a")
	victim := worker("stage-b")
	long := s.submit(ctx, t, "--model", "lenet5", "--dataset", "synthetic", "--workers", "2", "--pipeline-stages", "2",
		"--micro-batches", "4", "--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the pipeline job: %v", err)
	}
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("pipeline job ended %.1fs after the kill", time.Since(killed).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	t.Logf("%s: %s", sum.State, sum.Message)
	if sum.State != "FAILED" || !strings.Contains(sum.Message, "stage-b") || !strings.Contains(sum.Message, "pipeline stage 1 of 2") {
		t.Errorf("after kill -9 of stage-b: state %s, message %q; want FAILED naming stage-b and its pipeline stage 1 of 2", sum.State, sum.Message)
	}
	s.waitWorker(ctx, t, "stage-a", "IDLE")
}

// TestPipelineMemoryLimit: with every worker's --memory-limit between
// what vit-tiny's largest pipeline stage needs and what the whole model
// needs (jobspec.MemoryNeeds), the job on one worker is refused at
// placement, naming the whole model, its need and the worker's offer; on
// 4 stages it trains.
func TestPipelineMemoryLimit(t *testing.T) {
	spec := func(stages int32) *pb.JobSpec {
		s := &pb.JobSpec{Model: "vit-tiny", Workers: proto.Int32(stages), MaxSteps: 5, Seed: proto.Int64(1),
			Dataset: &pb.DatasetSpec{Name: "synthetic"}}
		if stages > 1 {
			s.Parallelism = &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: stages, MicroBatches: 4}}
		}
		n, err := jobspec.Normalize(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	whole, err := jobspec.MemoryNeeds(spec(1))
	if err != nil {
		t.Fatal(err)
	}
	staged, err := jobspec.MemoryNeeds(spec(4))
	if err != nil {
		t.Fatal(err)
	}
	var largest uint64
	for _, n := range staged {
		largest = max(largest, n.Bytes)
	}
	if largest >= whole[0].Bytes {
		t.Fatalf("vit-tiny's largest of 4 stages needs %d bytes, the whole model %d: no limit tells them apart", largest, whole[0].Bytes)
	}
	limit := fmt.Sprint((largest + whole[0].Bytes) / 2)
	run := func(args ...string) summary {
		ctx := testCtx(t, 3*time.Minute)
		base := []string{"local", "--json", "--model", "vit-tiny", "--dataset", "synthetic", "--max-steps", "5", "--seed", "1",
			"--runs-dir", t.TempDir(), "--memory-limit", limit}
		out, _ := gradsync(ctx, t, append(base, args...)...)
		return parseSummary(t, out)
	}
	one := run("--workers", "1")
	if one.State != "FAILED" || !strings.Contains(one.Message, "cannot be placed: rank 0 holds the whole model") ||
		!strings.Contains(one.Message, "local-0") {
		t.Errorf("one worker with --memory-limit %s: %s %q; want FAILED at placement naming the whole model and the worker", limit, one.State, one.Message)
	}
	four := run("--workers", "4", "--pipeline-stages", "4", "--micro-batches", "4")
	if four.State != "SUCCEEDED" {
		t.Errorf("4 stages with --memory-limit %s: %s %q", limit, four.State, four.Message)
	}
}
