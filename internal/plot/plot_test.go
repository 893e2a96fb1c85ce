package plot

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeMetrics writes lines (JSON-encoded records) as dir/metrics.jsonl,
// followed by tail verbatim.
func writeMetrics(t *testing.T, dir string, recs []map[string]any, tail string) {
	t.Helper()
	var b bytes.Buffer
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	b.WriteString(tail)
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// syntheticRun is a 3-epoch run logged the way the coordinator logs it:
// state, progress every 10 steps, eval at each epoch end, state.
func syntheticRun(ranks int) []map[string]any {
	t0 := time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	ts := func(s float64) string {
		return t0.Add(time.Duration(s * float64(time.Second))).Format(time.RFC3339Nano)
	}
	recs := []map[string]any{{"kind": "state", "state": "RUNNING", "message": "running on 2 worker(s)", "time": ts(0)}}
	const perEpoch, total = 100, 300
	for step := 10; step <= total; step += 10 {
		epoch := (step-1)/perEpoch + 1
		for r := range max(ranks, 1) {
			rec := map[string]any{
				"kind": "progress", "epoch": epoch, "step": step, "total_steps": total,
				"loss":              2.3*math.Exp(-float64(step)/80) + 0.1 + 0.01*float64(r),
				"images_per_second": 4000 + 500*math.Sin(float64(step)/20) + 300*float64(r),
				"learning_rate":     0.05, "elapsed_seconds": float64(step) / 50, "time": ts(float64(step) / 50),
			}
			if ranks > 0 {
				rec["rank"] = r
			}
			recs = append(recs, rec)
		}
		if step%perEpoch == 0 {
			recs = append(recs, map[string]any{
				"kind": "eval", "epoch": epoch, "step": step,
				"test_accuracy": 0.9 + 0.02*float64(epoch), "test_loss": 0.3 / float64(epoch), "train_loss": 0.35 / float64(epoch),
				"time": ts(float64(step)/50 + 0.1),
			})
		}
	}
	return append(recs, map[string]any{"kind": "state", "state": "SUCCEEDED", "time": ts(7)})
}

func TestRenderRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ranks int
		tail  string
	}{
		{"job", 0, ""},
		{"per-rank", 2, ""},
		{"cut-last-line", 0, `{"kind":"progress","epoch":3,"step":31`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "job-20261130-072308-3cb705")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			writeMetrics(t, dir, syntheticRun(tc.ranks), tc.tail)
			if err := RenderRun(dir); err != nil {
				t.Fatalf("RenderRun: %v", err)
			}
			checkChart(t, dir, LossChart, "step", "loss")
			checkChart(t, dir, AccuracyChart, "epoch", "test accuracy (%)")
			checkChart(t, dir, ThroughputChart, "step", "images/s")
			svg := readFile(t, filepath.Join(dir, ThroughputChart+".svg"))
			if got := strings.Contains(svg, "rank 1"); got != (tc.ranks > 1) {
				t.Errorf("throughput.svg has legend entry \"rank 1\" = %v, want %v", got, tc.ranks > 1)
			}
			if !strings.Contains(svg, "job-20261130-072308-3cb705") {
				t.Error("throughput.svg title lacks the job id")
			}
			// No temporary files are left behind.
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 7 {
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				t.Errorf("run dir holds %v, want metrics.jsonl and 6 charts", names)
			}
		})
	}
}

// TestRenderRunRounds: federated records carry "round", which becomes the
// accuracy chart's x axis.
func TestRenderRunRounds(t *testing.T) {
	dir := t.TempDir()
	var recs []map[string]any
	for r := 1; r <= 20; r++ {
		recs = append(recs, map[string]any{"kind": "eval", "round": r, "epoch": 1, "test_accuracy": 0.5 + 0.02*float64(r)})
	}
	writeMetrics(t, dir, recs, "")
	if err := RenderRun(dir); err != nil {
		t.Fatal(err)
	}
	checkChart(t, dir, AccuracyChart, "round", "test accuracy (%)")
	for _, name := range []string{LossChart, ThroughputChart} {
		if _, err := os.Stat(filepath.Join(dir, name+".png")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s.png written without data (stat: %v)", name, err)
		}
	}
}

func TestRenderRunErrors(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		if err := RenderRun(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("RenderRun = %v, want fs.ErrNotExist", err)
		}
	})
	for name, content := range map[string]string{
		"empty":       "",
		"states-only": `{"kind":"state","state":"RUNNING"}` + "\n" + `{"kind":"state","state":"FAILED","message":"boom"}` + "\n",
		"garbage":     "not json\n\x00\xff{{{\n[1,2,3]\n",
		"cut":         `{"kind":"progress","step":1`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := RenderRun(dir); !errors.Is(err, ErrNoData) {
				t.Errorf("RenderRun = %v, want ErrNoData", err)
			}
		})
	}
}

// TestRenderRunOddData: single samples, wrong types, huge and repeated
// values still give charts.
func TestRenderRunOddData(t *testing.T) {
	dir := t.TempDir()
	content := strings.Join([]string{
		`{"kind":"progress","step":5,"loss":1.5,"images_per_second":100}`,
		`{"kind":"progress","step":"six","loss":1.4}`, // wrong type: skipped
		`{"kind":"progress","step":7,"loss":1e308,"images_per_second":0}`,
		`{"kind":"progress","step":5,"loss":1.2}`, // repeated step: later wins
		`{"kind":"eval","epoch":1,"test_accuracy":97.5}`,
		``,
		`{"kind":"eval","epoch":1,"test_accuracy":98}`,
	}, "\n")
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := RenderRun(dir); err != nil {
		t.Fatal(err)
	}
	checkChart(t, dir, LossChart, "step", "loss")
	checkChart(t, dir, AccuracyChart, "epoch", "test accuracy (%)")
	checkChart(t, dir, ThroughputChart, "step", "images/s")
}

func TestReadMetrics(t *testing.T) {
	in := strings.Join([]string{
		`{"kind":"progress","step":20,"loss":2,"images_per_second":10}`,
		`{"kind":"progress","step":10,"loss":3,"images_per_second":9}`,
		`{"kind":"progress","step":20,"loss":1.5,"images_per_second":11}`,
		`{"kind":"eval","epoch":1,"step":20,"test_accuracy":0.9,"test_loss":0.4}`,
		`{"kind":"progress","step":10,"rank":1,"loss":3.1}`,
		`{"kind":"progress","step":30,`,
	}, "\n")
	d, err := readMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if d.skipped != 1 {
		t.Errorf("skipped = %d, want 1", d.skipped)
	}
	got := fmt.Sprint(sortedSeries(d.loss))
	if want := "[{-1 [{10 3} {20 1.5}]} {1 [{10 3.1}]}]"; got != want {
		t.Errorf("loss series = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(percent(sortedSeries(d.accuracy))), "[{-1 [{1 90}]}]"; got != want {
		t.Errorf("accuracy series = %s, want %s", got, want)
	}
	if d.byRound {
		t.Error("byRound without rounds")
	}
}

// checkChart checks that name.png decodes to a 600×400 image and name.svg
// is well-formed XML whose text includes both axis labels.
func checkChart(t *testing.T, dir, name, xLabel, yLabel string) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, name+".png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s.png: %v", name, err)
	}
	if b := img.Bounds(); b.Dx() != 600 || b.Dy() != 400 {
		t.Errorf("%s.png is %dx%d, want 600x400", name, b.Dx(), b.Dy())
	}

	svg := readFile(t, filepath.Join(dir, name+".svg"))
	dec := xml.NewDecoder(strings.NewReader(svg))
	var text strings.Builder
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s.svg is not XML: %v", name, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	if root != "svg" {
		t.Errorf("%s.svg root element is %q, want svg", name, root)
	}
	for _, label := range []string{xLabel, yLabel} {
		if !strings.Contains(text.String(), label) {
			t.Errorf("%s.svg text lacks axis label %q", name, label)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
