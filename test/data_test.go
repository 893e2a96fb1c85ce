package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/data"
)

// lastJSON decodes the last output line (the summary) as a map, so fields
// beyond summary's are seen too.
func lastJSON(t *testing.T, out []string) map[string]any {
	t.Helper()
	if len(out) == 0 {
		t.Fatal("no output")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out[len(out)-1]), &m); err != nil {
		t.Fatalf("last line %q: %v", out[len(out)-1], err)
	}
	return m
}

// TestStreamedDataJobs runs `gradsync local` on the streamed data sets:
// an ImageFolder of PNGs trains and reports its loader's images/s; a
// CIFAR-100-layout set with coarse labels says so in the summary; and a
// truncated PNG, which the client's shape reading (headers only) lets
// through, fails the job on the worker with the file named.
func TestStreamedDataJobs(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 3*time.Minute)
	dir := t.TempDir()
	pix := make([]uint8, 40*64)
	labels := make([]uint8, 40)
	for i := range labels {
		labels[i] = uint8(i % 2)
		for p := range 64 {
			pix[i*64+p] = uint8((p%8)*30*int(labels[i]) + i)
		}
	}
	for _, split := range []string{"train", "test"} {
		if err := data.WriteImageFolder(context.Background(), dir, split, pix, labels, 40, 1, 8, 8, 2); err != nil {
			t.Fatal(err)
		}
	}
	local := func(args ...string) map[string]any {
		t.Helper()
		out, _ := gradsync(ctx, t, append([]string{"local", "--json", "--runs-dir", t.TempDir(), "--model", "mlp", "--epochs", "1",
			"--batch-size", "8", "--log-every", "1"}, args...)...)
		return lastJSON(t, out)
	}
	s := local("--dataset", "imagefolder", "--data-dir", dir, "--channels", "1")
	if s["state"] != "SUCCEEDED" {
		t.Fatalf("imagefolder job %v: %v", s["state"], s["message"])
	}
	if v, _ := s["loader_images_per_second"].(float64); !(v > 0) {
		t.Errorf("summary loader_images_per_second %v, want > 0", s["loader_images_per_second"])
	}

	color := t.TempDir()
	if err := data.WriteColorSet(color, 64, 16, 1); err != nil {
		t.Fatal(err)
	}
	s = local("--dataset", "cifar100", "--data-dir", color, "--label-granularity", "coarse")
	if s["state"] != "SUCCEEDED" || s["label_granularity"] != "coarse" {
		t.Errorf("cifar100 coarse job: %v, granularity %v: %v", s["state"], s["label_granularity"], s["message"])
	}

	bad := filepath.Join(dir, "train", "1", "01.png")
	b, err := os.ReadFile(bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, b[:len(b)-20], 0o644); err != nil {
		t.Fatal(err)
	}
	s = local("--dataset", "imagefolder", "--data-dir", dir, "--channels", "1")
	if msg, _ := s["message"].(string); s["state"] != "FAILED" || !strings.Contains(msg, bad) {
		t.Errorf("job with a truncated PNG: %v: %q; want FAILED naming %s", s["state"], msg, bad)
	}
	t.Logf("the job with a truncated PNG: %v: %v", s["state"], s["message"])
}
