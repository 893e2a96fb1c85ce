package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestFedAvgMultiLabel runs federated rounds over a multi-label
// ImageFolder (a labels.csv): the code set's 16 classes, each image
// labelled with the bits of its class's code ("b0" … "b3"; class 0 with
// none), which its pixels show. The simulated clients (iid) train with
// BCE, and the result carries the subset accuracy, F1 and mAP.
func TestFedAvgMultiLabel(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	dir := t.TempDir()
	if err := data.WriteCodeSet(ctx, dir, 16, 12, 5); err != nil {
		t.Fatal(err)
	}
	var csv strings.Builder
	for _, split := range []string{"train", "test"} {
		classes, err := os.ReadDir(filepath.Join(dir, split))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range classes {
			k, err := strconv.Atoi(c.Name())
			if err != nil {
				t.Fatal(err)
			}
			var labels []string
			for b := range 4 {
				if k>>b&1 == 1 {
					labels = append(labels, "b"+strconv.Itoa(b))
				}
			}
			files, err := os.ReadDir(filepath.Join(dir, split, c.Name()))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				fmt.Fprintf(&csv, "%s/%s/%s,%s\n", split, c.Name(), f.Name(), strings.Join(labels, ";"))
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, data.LabelsCSV), []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := gradsync(ctx, t, "local", "--json", "--runs-dir", t.TempDir(), "--model", "logreg", "--dataset", "imagefolder",
		"--data-dir", dir, "--channels", "1", "--mode", "fedavg", "--workers", "1", "--clients", "6", "--fraction", "0.5",
		"--rounds", "8", "--local-epochs", "2", "--lr", "0.5", "--log-every", "1000")
	s := lastJSON(t, out)
	acc, _ := s["test_accuracy"].(float64)
	f1, _ := s["micro_f1"].(float64)
	mAP, _ := s["mean_average_precision"].(float64)
	t.Logf("fedavg on a 4-label set: %v, subset accuracy %.4f, micro F1 %.4f, mAP %.4f", s["state"], acc, f1, mAP)
	// Chance: a subset is right by guessing with probability 1/16.
	if s["state"] != "SUCCEEDED" || acc < 0.5 || f1 < 0.8 || mAP < 0.8 {
		t.Fatalf("%v, subset accuracy %.4f, micro F1 %.4f, mAP %.4f (want SUCCEEDED, ≥ 0.5, ≥ 0.8, ≥ 0.8): %v", s["state"], acc, f1, mAP, s["message"])
	}
	// Partitions that deal one label per example are refused.
	p := start(t, "gradsync local", "local", "--json", "--runs-dir", t.TempDir(), "--model", "logreg", "--dataset", "imagefolder",
		"--data-dir", dir, "--channels", "1", "--mode", "fedavg", "--workers", "1", "--partition", "dirichlet")
	if code := p.wait(ctx, t); code == 0 || !strings.Contains(p.stderr.String(), "partition.type") {
		t.Errorf("a Dirichlet partition of a multi-label set: exit %d, %q; want a refusal naming partition.type", code, p.stderr)
	}
}
