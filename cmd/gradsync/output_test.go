package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gradsync/gradsync/bench/train"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/internal/security"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// documentedFields reads the field names of the README's "Machine-readable
// output" table (the first column's `names`).
func documentedFields(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Machine-readable output\n")
	if !ok {
		t.Fatal(`README.md has no "## Machine-readable output" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	names := regexp.MustCompile("`([a-z_]+)`")
	fields := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(sec))
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "|")
		if len(cols) < 3 || strings.HasPrefix(strings.TrimSpace(cols[1]), "---") {
			continue
		}
		for _, m := range names.FindAllStringSubmatch(cols[1], -1) {
			fields[m[1]] = true
		}
	}
	if len(fields) < 20 {
		t.Fatalf("the README's vocabulary table has %d fields; the parser or the table is broken", len(fields))
	}
	return fields
}

// summaryFields are runlog.Summary's JSON names: the README documents
// them as "a summary's other fields".
func summaryFields() map[string]bool {
	m := map[string]bool{}
	st := reflect.TypeFor[runlog.Summary]()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		m[name] = true
	}
	return m
}

// fixedJob is a finished two-worker job with a result.
func fixedJob() *pb.Job {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return &pb.Job{Id: "job-1", State: pb.JobState_JOB_STATE_SUCCEEDED, Message: "test accuracy 97.00% after 1 epoch(s)",
		RunDir: "/runs/job-1", WorkerIds: []string{"w0", "w1"},
		CreatedAt: timestamppb.New(t0), StartedAt: timestamppb.New(t0.Add(time.Second)), FinishedAt: timestamppb.New(t0.Add(9 * time.Second)),
		Spec:     &pb.JobSpec{Name: "n", Model: "mlp", Mode: "ps", Workers: proto.Int32(2), Epochs: proto.Int32(1), Dataset: &pb.DatasetSpec{Name: "mnist"}},
		Progress: &pb.Progress{Epoch: 1, Step: 938, TotalSteps: 938, Loss: 0.1, ImagesPerSecond: 1e4, LearningRate: 0.05},
		Result:   &pb.JobResult{TestAccuracy: 0.97, TestLoss: 0.09, Epochs: 1, Steps: 938, WallSeconds: 8, GemmBackend: "gonum"}}
}

// events are one of each event kind of fixedJob's watch stream.
func events() []*pb.WatchJobResponse {
	j := fixedJob()
	at := timestamppb.New(time.Date(2026, 12, 1, 10, 0, 9, 0, time.UTC))
	return []*pb.WatchJobResponse{
		{Kind: pb.EventKind_EVENT_KIND_PROGRESS, Job: j, Time: at},
		{Kind: pb.EventKind_EVENT_KIND_EVAL, Job: j, Time: at, Epoch: 1, TestAccuracy: 0.97, TestLoss: 0.09},
		{Kind: pb.EventKind_EVENT_KIND_LOG, Job: j, Time: at, Message: "rank 1 is a straggler"},
		{Kind: pb.EventKind_EVENT_KIND_STATE, Job: j, Time: at, Message: j.Message},
	}
}

// TestJSONVocabulary runs every command's JSON encoder on fixed jobs,
// events and workers: every field is in the README's table (or is a
// summary field), jobs are job_id and workers worker_id (never id), and
// states are spelled PENDING…/IDLE… (never JOB_STATE_…).
func TestJSONVocabulary(t *testing.T) {
	doc, sum := documentedFields(t), summaryFields()
	var out bytes.Buffer
	p := &printer{out: &out, json: true}
	// watch, local, submit --watch: events, then the summary.
	for _, ev := range events() {
		p.event(ev)
	}
	p.summary(fixedJob())
	// jobs, submit, cancel.
	p.job(fixedJob())
	p.job(&pb.Job{Id: "job-2", State: pb.JobState_JOB_STATE_PENDING, CreatedAt: timestamppb.Now()})
	// workers, server/worker --json, certs init, bench train.
	p.jsonLine(workerLineOf(&pb.Worker{Id: "w0", Name: "host-a", State: pb.WorkerState_WORKER_STATE_BUSY, Address: "10.0.0.1:7071",
		Resources: &pb.Resources{CpuCores: 8, GemmBackend: "openblas"}, JobId: "job-1", LastHeartbeat: timestamppb.Now(), MemoryBytes: 16 << 30}))
	p.jsonLine(listeningEvent{Event: "listening", Address: "127.0.0.1:7070"})
	p.jsonLine(certsLineOf(security.Paths{Dir: "certs", CA: "certs/ca.pem", Token: "certs/token"}))
	p.jsonLine(logLine{Event: "log", JobID: "job-1", Rank: 1, Message: "epoch 1"})
	p.jsonLine(train.Result{Model: "mlp", Backend: "gonum", BatchSize: 64, Threads: 1, BLASThreads: 1, ImagesPerSecond: 1e4, Steps: 10, SecondsPerStep: 0.006})

	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not one JSON object per line: %q: %v", l, err)
		}
		lines = append(lines, m)
		for k, v := range m {
			if !doc[k] && !sum[k] {
				t.Errorf("field %q is not in the README's vocabulary table: %s", k, l)
			}
			if s, ok := v.(string); ok && (strings.HasPrefix(s, "JOB_STATE_") || strings.HasPrefix(s, "WORKER_STATE_")) {
				t.Errorf("%s: %q is an enum spelling; want the short state name", k, s)
			}
		}
		if _, ok := m["id"]; ok {
			t.Errorf(`a line says "id": %s`, l)
		}
	}
	if len(lines) != 12 {
		t.Fatalf("%d lines, want 12:\n%s", len(lines), out.String())
	}
	// Every line about a job names it job_id, and says its state the
	// same way.
	for i, want := range []string{"", "", "", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "PENDING"} {
		if lines[i]["job_id"] == nil {
			t.Errorf("line %d has no job_id: %v", i, lines[i])
		}
		if want != "" && lines[i]["state"] != want {
			t.Errorf("line %d: state %v, want %s", i, lines[i]["state"], want)
		}
	}
	for i, ev := range []string{"progress", "eval", "log", "state"} {
		if lines[i]["event"] != ev {
			t.Errorf("line %d: event %v, want %s", i, lines[i]["event"], ev)
		}
	}
	if w := lines[7]; w["worker_id"] != "w0" || w["state"] != "BUSY" || w["job_id"] != "job-1" || w["gemm_backend"] != "openblas" {
		t.Errorf("worker line %v", w)
	}
	if j := lines[5]; j["workers"] != 2.0 || j["steps"] != 938.0 || j["test_accuracy"] != 0.97 || j["created_at"] != "2026-12-01T10:00:00Z" {
		t.Errorf("job line %v", j)
	}
	if b := lines[11]; b["gemm_backend"] != "gonum" || b["images_per_second"] != 1e4 {
		t.Errorf("bench train line %v", b)
	}
}

// The human output of a watched job says that it ended once: the
// job's final state line heads the summary block.
func TestHumanSummarySaysItOnce(t *testing.T) {
	var out bytes.Buffer
	p := &printer{out: &out}
	for _, ev := range events() {
		p.event(ev)
	}
	p.summary(fixedJob())
	if n := strings.Count(out.String(), "job job-1 SUCCEEDED"); n != 1 {
		t.Errorf("the output says the job SUCCEEDED %d times:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "\njob job-1 SUCCEEDED: test accuracy 97.00% after 1 epoch(s)\n  model mlp  dataset mnist  mode ps") {
		t.Errorf("the final state line does not head the summary:\n%s", out.String())
	}
	// A summary without the final event (a job already ended when
	// watched from another printer) still says how the job ended.
	out.Reset()
	(&printer{out: &out}).summary(fixedJob())
	if !strings.HasPrefix(out.String(), "\njob job-1 SUCCEEDED: ") {
		t.Errorf("summary alone:\n%s", out.String())
	}
}

// pipelineJob is fixedJob as a pipeline job of 2 stages whose ranks
// reported their stages' figures.
func pipelineJob() *pb.Job {
	j := fixedJob()
	j.Ranks = []*pb.Progress{
		{Step: 40, TotalSteps: 100, PipelineStages: 2, PipelineStage: 0, StageStepSeconds: 0.04, StageIdleFraction: 0.2, StagePeakInFlight: 2, StagePeakActivationBytes: 3 << 20},
		{Step: 40, TotalSteps: 100, PipelineStages: 2, PipelineStage: 1, StageStepSeconds: 0.04, StageIdleFraction: 0.25, StagePeakInFlight: 1, StagePeakActivationBytes: 5 << 10},
	}
	return j
}

// TestWatchShowsStages: a pipeline job's progress shows each stage's
// figures, in text and in --json.
func TestWatchShowsStages(t *testing.T) {
	var out bytes.Buffer
	p := &printer{out: &out}
	p.event(&pb.WatchJobResponse{Kind: pb.EventKind_EVENT_KIND_PROGRESS, Job: pipelineJob()})
	for _, want := range []string{
		"rank 0  stage 0 replica 0: 40ms/step  idle 20.0%  ≤2 micro-batches in flight  activations 3MiB",
		"rank 1  stage 1 replica 0: 40ms/step  idle 25.0%  ≤1 micro-batches in flight  activations 5KiB",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("watch printed %q; want a line %q", out.String(), want)
		}
	}
	out.Reset()
	p = &printer{out: &out, json: true}
	p.event(&pb.WatchJobResponse{Kind: pb.EventKind_EVENT_KIND_PROGRESS, Job: pipelineJob()})
	var ev progressEvent
	if err := json.Unmarshal(out.Bytes(), &ev); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	doc := documentedFields(t)
	for k := range m {
		if !doc[k] {
			t.Errorf("field %q is not in the README's vocabulary table: %s", k, out.String())
		}
	}
	want := []stageLine{{Rank: 0, Stage: 0, StepSeconds: 0.04, IdleFraction: 0.2, PeakInFlight: 2, PeakActivationBytes: 3 << 20},
		{Rank: 1, Stage: 1, StepSeconds: 0.04, IdleFraction: 0.25, PeakInFlight: 1, PeakActivationBytes: 5 << 10}}
	if !slices.Equal(ev.Stages, want) {
		t.Errorf("--json stages %+v; want %+v", ev.Stages, want)
	}
	// Other jobs have none.
	out.Reset()
	p.event(&pb.WatchJobResponse{Kind: pb.EventKind_EVENT_KIND_PROGRESS, Job: fixedJob()})
	if strings.Contains(out.String(), "stages") {
		t.Errorf("a job without stages: %s", out.String())
	}
}
