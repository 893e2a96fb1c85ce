package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gradsync/gradsync/data"
)

// TestFedAvgWideLabelSpace runs federated rounds over an ImageFolder of
// 300 classes — more than a byte label holds — partitioned Dirichlet(0.3)
// over 10 simulated clients: the clients hold the data in memory with its
// labels unchanged (a byte label would wrap class 299 to 43), the job
// learns every class, and each round's record carries every participant's
// 300-count label histogram.
func TestFedAvgWideLabelSpace(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	const classes = 300
	dir := t.TempDir()
	if err := data.WriteCodeSet(ctx, dir, classes, 6, 3); err != nil {
		t.Fatal(err)
	}
	runs := t.TempDir()
	out, _ := gradsync(ctx, t, "local", "--json", "--runs-dir", runs, "--model", "logreg", "--dataset", "imagefolder",
		"--data-dir", dir, "--channels", "1", "--mode", "fedavg", "--workers", "1", "--clients", "10", "--fraction", "0.5",
		"--partition", "dirichlet", "--alpha", "0.3", "--rounds", "8", "--local-epochs", "2", "--lr", "0.5", "--log-every", "1000")
	s := lastJSON(t, out)
	acc, _ := s["test_accuracy"].(float64)
	t.Logf("fedavg over %d classes: %v, test accuracy %.4f", classes, s["state"], acc)
	if s["state"] != "SUCCEEDED" || acc < 0.5 { // chance 1/300
		t.Fatalf("%v, test accuracy %.4f (want SUCCEEDED, ≥ 0.5): %v", s["state"], acc, s["message"])
	}
	runDir, _ := s["run_dir"].(string)
	f, err := os.Open(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	rounds := 0
	for sc.Scan() {
		var rec struct {
			Kind            string  `json:"kind"`
			LabelHistograms [][]int `json:"label_histograms"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Kind != "eval" || rec.LabelHistograms == nil {
			continue
		}
		rounds++
		high := 0
		for _, h := range rec.LabelHistograms {
			if len(h) != classes {
				t.Fatalf("a participant's histogram has %d counts, want %d", len(h), classes)
			}
			for _, n := range h[256:] {
				high += n
			}
		}
		if high == 0 {
			t.Errorf("no participant holds an example of the classes above 255")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if rounds == 0 {
		t.Fatal("no round record with label histograms in metrics.jsonl")
	}
}
