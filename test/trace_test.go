package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/internal/trace"
)

// TestTraceOfRingJob runs a 2-worker ring job with --trace: each rank
// writes a Chrome trace that passes the trace-event format's checks,
// holding forward and backward per layer, every bucket's all-reduce and
// the optimiser step of every step; the summary carries rank 0's
// compute/communication overlap, the same figure its trace file states.
// (How much overlaps depends on the machine: the test does not ask for
// more than a figure in [0, 1].)
func TestTraceOfRingJob(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 2*time.Minute)
	dir := t.TempDir()
	const steps = 12
	out, _ := gradsync(ctx, t, "local", "--json", "--runs-dir", filepath.Join(dir, "runs"), "--mode", "ring", "--workers", "2",
		"--model", "lenet5", "--dataset", "synthetic", "--max-steps", fmt.Sprint(steps), "--trace", filepath.Join(dir, "trace.json"))
	s := lastJSON(t, out)
	if s["state"] != "SUCCEEDED" {
		t.Fatalf("job %v: %v", s["state"], s["message"])
	}
	ratio, _ := s["comm_overlap_ratio"].(float64)
	if ratio < 0 || ratio > 1 {
		t.Errorf("comm_overlap_ratio %v, want a share in [0, 1]", s["comm_overlap_ratio"])
	}
	for rank := range 2 {
		path := filepath.Join(dir, fmt.Sprintf("trace-rank%d.json", rank))
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := trace.Validate(b)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		count := map[string]int{}
		layers := map[string]bool{}
		for _, e := range evs {
			cat, _ := e["cat"].(string)
			if e["ph"] == "X" {
				count[cat]++
			}
			if name, _ := e["name"].(string); cat == trace.CatBackward {
				layers[strings.TrimPrefix(name, "backward ")] = true
			}
		}
		t.Logf("rank %d: %d events %v, backward of layers %v", rank, len(evs), count, layers)
		// lenet5 runs 10 layers per forward (rank 0 also evaluates)
		if count[trace.CatStep] != steps || count[trace.CatForward] < 8*steps || count[trace.CatOptim] != steps || count[trace.CatComm] < steps {
			t.Errorf("rank %d: %d forward + loss, %d layer forward, %d optimiser, %d all-reduce spans; want %d, ≥ %d, %d and ≥ %d", rank,
				count[trace.CatStep], count[trace.CatForward], count[trace.CatOptim], count[trace.CatComm], steps, 8*steps, steps, steps)
		}
		if len(layers) != 5 { // lenet5's layers with parameters: two convolutions, three linear layers
			t.Errorf("rank %d: backward spans of layers %v, want lenet5's 5", rank, layers)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "trace-rank0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`"comm_overlap_ratio":"%.4f"`, ratio); !strings.Contains(string(b), want) {
		t.Errorf("rank 0's trace does not state the summary's overlap (%s)", want)
	}
	t.Logf("comm_overlap_ratio %.4f", ratio)
}
