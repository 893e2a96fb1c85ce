package e2e

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/data"
)

// writeDigits writes a small MNIST-shaped data set (28×28 images, IDX
// files) into dir: nTrain training images of the given classes and
// nTest test images of all ten. Class c is a bright vertical band at
// columns 2c+4..2c+5 over noise, so a linear model can learn it.
func writeDigits(t *testing.T, dir string, classes []int, nTrain, nTest int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	images := func(labels []byte) []byte {
		pix := make([]byte, len(labels)*28*28)
		for i, c := range labels {
			img := pix[i*784 : (i+1)*784]
			for p := range img {
				img[p] = byte(r.IntN(90))
			}
			for y := 2 + r.IntN(4); y < 24+r.IntN(4); y++ {
				for x := 2*int(c) + 4; x < 2*int(c)+6; x++ {
					img[y*28+x] = byte(180 + r.IntN(76))
				}
			}
		}
		return pix
	}
	trainLabels := make([]byte, nTrain)
	for i := range trainLabels {
		trainLabels[i] = byte(classes[r.IntN(len(classes))])
	}
	testLabels := make([]byte, nTest)
	for i := range testLabels {
		testLabels[i] = byte(i % 10)
	}
	for name, b := range map[string][]byte{
		"train-images-idx3-ubyte": data.EncodeIDX([]int{nTrain, 28, 28}, images(trainLabels)),
		"train-labels-idx1-ubyte": data.EncodeIDX([]int{nTrain}, trainLabels),
		"t10k-images-idx3-ubyte":  data.EncodeIDX([]int{nTest, 28, 28}, images(testLabels)),
		"t10k-labels-idx1-ubyte":  data.EncodeIDX([]int{nTest}, testLabels),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRealFederatedClients runs a fedavg job on three worker processes,
// each a real client with its own --data-dir holding a different few
// classes (Non-IID by construction): the global model, evaluated by client
// 0 on all ten classes, learns classes no single client holds, and the
// round records name the clients and their label histograms.
func TestRealFederatedClients(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	for k, classes := range [][]int{{0, 1, 2, 3}, {3, 4, 5, 6}, {6, 7, 8, 9}} {
		id := "fed-w" + string(rune('0'+k))
		ddir := filepath.Join(dir, id)
		if err := os.Mkdir(ddir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeDigits(t, ddir, classes, 400, 200, uint64(k+1))
		start(t, "worker "+id, "worker", "--server", s.addr, "--id", id, "--data-dir", ddir)
		s.waitWorker(ctx, t, id, "IDLE")
	}
	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json", "--mode", "fedavg", "--workers", "3",
		"--model", "logreg", "--dataset", "mnist", "--rounds", "5", "--fraction", "1", "--local-batch", "20")
	if code != 0 {
		t.Fatalf("submit --watch: exit %d\n%s", code, strings.Join(out, "\n"))
	}
	sum := parseSummary(t, out)
	if sum.State != "SUCCEEDED" {
		t.Fatalf("state %s: %s", sum.State, sum.Message)
	}
	t.Logf("%s: %s", sum.State, sum.Message)
	if sum.TestAccuracy < 0.8 {
		t.Errorf("test accuracy %.3f on all ten classes, want ≥ 0.8 (each client holds only four)", sum.TestAccuracy)
	}
	b, err := os.ReadFile(filepath.Join(sum.RunDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	rounds := 0
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			Kind            string
			Round           int
			Participants    []int
			LabelHistograms [][]int `json:"label_histograms"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("metrics.jsonl line %q: %v", l, err)
		}
		if rec.Kind != "eval" {
			continue
		}
		rounds++
		if len(rec.Participants) != 3 || len(rec.LabelHistograms) != 3 {
			t.Fatalf("round %d: participants %v, histograms %v; want all three clients", rec.Round, rec.Participants, rec.LabelHistograms)
		}
		// Client 1 holds classes 3..6 only.
		for c, n := range rec.LabelHistograms[1] {
			if (c < 3 || c > 6) && n != 0 {
				t.Errorf("round %d: client 1 has %d examples of class %d; its data has only classes 3..6", rec.Round, n, c)
			}
		}
	}
	if rounds != 5 {
		t.Errorf("%d round records in metrics.jsonl, want 5", rounds)
	}
}
