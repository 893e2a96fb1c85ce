package runlog

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestRunDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "job-1")
	spec := &pb.JobSpec{Name: "n", Model: "logreg", Workers: proto.Int32(2), Dataset: &pb.DatasetSpec{Name: "synthetic"}}
	w, err := Create(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	if w.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", w.Dir(), dir)
	}
	// spec.json is the spec, in proto field names.
	b, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"model"`) || strings.Contains(string(b), "batchSize") {
		t.Errorf("spec.json does not use proto names:\n%s", b)
	}
	got := &pb.JobSpec{}
	if err := protojson.Unmarshal(b, got); err != nil || !proto.Equal(got, spec) {
		t.Errorf("spec.json = %s (err %v); want %v", b, err, spec)
	}

	// Concurrent Log calls each append one whole line.
	const goroutines, per = 8, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if err := w.Log(map[string]any{"kind": "progress", "g": g, "i": i, "pad": strings.Repeat("x", 300)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()

	j := &pb.Job{Id: "job-1", Spec: spec, State: pb.JobState_JOB_STATE_SUCCEEDED, Message: "ok", RunDir: dir,
		Result: &pb.JobResult{TestAccuracy: 0.95, Epochs: 1, Steps: 10, WallSeconds: 2, ImagesPerSecond: 100, GemmBackend: "gonum"}}
	if err := w.Finish(SummaryOf(j)); err != nil {
		t.Fatal(err)
	}
	if err := w.Log(map[string]any{"late": true}); err == nil {
		t.Error("Log after Finish: no error")
	}

	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("metrics.jsonl line %d is not JSON: %v: %q", n+1, err, sc.Text())
		}
		n++
	}
	if n != goroutines*per {
		t.Errorf("metrics.jsonl has %d lines, want %d", n, goroutines*per)
	}

	var s Summary
	b, err = os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	want := Summary{JobID: "job-1", Name: "n", State: "SUCCEEDED", Message: "ok", Model: "logreg", Dataset: "synthetic",
		Workers: 2, Epochs: 1, Steps: 10, TestAccuracy: 0.95, WallSeconds: 2, ImagesPerSecond: 100, GemmBackend: "gonum", RunDir: dir}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("summary.json = %+v\nwant %+v", s, want)
	}
	// No temporary files are left behind by the atomic writes.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "metrics.jsonl,spec.json,summary.json" {
		t.Errorf("run directory holds %v; want exactly metrics.jsonl, spec.json, summary.json", names)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A reader that opened the old file keeps seeing the old contents whole:
	// the new file replaces it by rename, not by rewriting in place.
	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := writeFileAtomic(p, []byte("new contents")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	n, _ := old.Read(b)
	if string(b[:n]) != "old" {
		t.Errorf("the old file was rewritten in place: %q", b[:n])
	}
	if got, _ := os.ReadFile(p); string(got) != "new contents" {
		t.Errorf("file = %q", got)
	}
	// A write that cannot happen leaves the old file alone and no temp file.
	if err := writeFileAtomic(filepath.Join(dir, "missing", "x.json"), []byte("x")); err == nil {
		t.Error("write into a missing directory: no error")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want 1 (no temp files left)", len(ents))
	}
}

func TestCreateErrors(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(filepath.Join(f, "job"), &pb.JobSpec{}); err == nil {
		t.Error("Create under a regular file: no error")
	}
}

func TestSummaryOf(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := &pb.Job{Id: "j", State: pb.JobState_JOB_STATE_FAILED, Message: "worker lost",
		StartedAt: timestamppb.New(start), FinishedAt: timestamppb.New(start.Add(3 * time.Second))}
	s := SummaryOf(j)
	if s.State != "FAILED" || s.Message != "worker lost" || s.WallSeconds != 3 {
		t.Errorf("SummaryOf = %+v; want state FAILED, the message, wall 3s from the timestamps", s)
	}
	if got := StateName(pb.JobState_JOB_STATE_CANCELLED); got != "CANCELLED" {
		t.Errorf("StateName = %q", got)
	}
	// The JSON keys are the contract the CLI's --json summary line follows.
	b, _ := json.Marshal(SummaryOf(&pb.Job{}))
	for _, k := range []string{`"job_id"`, `"state"`, `"test_accuracy"`, `"run_dir"`, `"wall_seconds"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("summary JSON %s lacks %s", b, k)
		}
	}
}
