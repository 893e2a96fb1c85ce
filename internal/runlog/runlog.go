// Package runlog writes a job's run directory — runs/<job-id>/spec.json,
// metrics.jsonl (one JSON object per logged step, evaluation or state
// change) and summary.json — and defines the summary object that the CLI
// prints as its last --json line, so both always agree.
package runlog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Summary is the outcome of a job, as written to summary.json and printed
// last by `gradsync local --json` and `gradsync submit --watch --json`.
type Summary struct {
	JobID           string  `json:"job_id"`
	Name            string  `json:"name"`
	State           string  `json:"state"`
	Message         string  `json:"message,omitempty"`
	Model           string  `json:"model"`
	Dataset         string  `json:"dataset"`
	Mode            string  `json:"mode"`
	Workers         int32   `json:"workers"`
	Epochs          int32   `json:"epochs"`
	Steps           int64   `json:"steps"`
	TestAccuracy    float64 `json:"test_accuracy"`
	TestLoss        float64 `json:"test_loss"`
	TrainLoss       float64 `json:"train_loss"`
	WallSeconds     float64 `json:"wall_seconds"`
	ImagesPerSecond float64 `json:"images_per_second"`
	// LoaderImagesPerSecond is rank 0's data loader capacity (streamed
	// data sets: imagefolder, cifar10, cifar100), beside images_per_second.
	LoaderImagesPerSecond float64 `json:"loader_images_per_second,omitempty"`
	// CommOverlapRatio is the share of rank 0's all-reduce time that ran
	// while backward was computing (ring jobs traced with --trace).
	CommOverlapRatio float64 `json:"comm_overlap_ratio,omitempty"`
	// LabelGranularity is cifar100's label granularity (fine or coarse).
	LabelGranularity string `json:"label_granularity,omitempty"`
	GemmBackend      string `json:"gemm_backend,omitempty"`
	RunDir           string `json:"run_dir"`
	// ParameterChecksum fingerprints the final parameters (FNV-1a over
	// their float32 bits, as JobResult.parameter_checksum), as 16 hex
	// digits: two runs that computed the same thing print the same value.
	ParameterChecksum string `json:"parameter_checksum,omitempty"`
	// ClassAccuracy and ConfusionMatrix ([true][predicted]) of the final
	// evaluation; in summary.json only (omitted from the CLI's last line
	// when empty).
	// Ring mode: gradient bytes per step before and after compression.
	RawBytesPerStep  float64 `json:"raw_bytes_per_step,omitempty"`
	SentBytesPerStep float64 `json:"sent_bytes_per_step,omitempty"`
	CompressionRatio float64 `json:"compression_ratio,omitempty"`
	CompressSeconds  float64 `json:"compress_seconds,omitempty"`
	// Multi-label tasks (test_accuracy is then the exact-match accuracy).
	MicroF1              float64   `json:"micro_f1,omitempty"`
	MacroF1              float64   `json:"macro_f1,omitempty"`
	MeanAveragePrecision float64   `json:"mean_average_precision,omitempty"`
	ClassAccuracy        []float64 `json:"class_accuracy,omitempty"`
	ConfusionMatrix      [][]int64 `json:"confusion_matrix,omitempty"`
	// Precision of the engine's matrix products when not fp32; with fp16,
	// the optimiser steps rank 0's loss scaler skipped for inf/NaN
	// gradients (0 included) and its final scale.
	Precision    string  `json:"precision,omitempty"`
	SkippedSteps *int64  `json:"skipped_steps,omitempty"`
	LossScale    float64 `json:"loss_scale,omitempty"`
}

// StateName is the short name of a job state ("SUCCEEDED").
func StateName(s pb.JobState) string {
	return strings.TrimPrefix(s.String(), "JOB_STATE_")
}

// SummaryOf builds the summary of a job.
func SummaryOf(j *pb.Job) Summary {
	s := Summary{
		JobID: j.GetId(), Name: j.GetSpec().GetName(), State: StateName(j.GetState()), Message: j.GetMessage(),
		Model: j.GetSpec().GetModel(), Dataset: j.GetSpec().GetDataset().GetName(), Mode: j.GetSpec().GetMode(),
		Workers: j.GetSpec().GetWorkers(), RunDir: j.GetRunDir(),
		LabelGranularity: j.GetSpec().GetDataset().GetLabelGranularity(),
	}
	if p := j.GetSpec().GetPrecision(); p != "" && p != "fp32" {
		s.Precision = p
	}
	if r := j.GetResult(); r != nil {
		s.Epochs, s.Steps = r.Epochs, r.Steps
		s.TestAccuracy, s.TestLoss, s.TrainLoss = r.TestAccuracy, r.TestLoss, r.TrainLoss
		s.WallSeconds, s.ImagesPerSecond, s.GemmBackend = r.WallSeconds, r.ImagesPerSecond, r.GemmBackend
		s.LoaderImagesPerSecond = r.LoaderImagesPerSecond
		s.CommOverlapRatio = r.CommOverlapRatio
		s.ClassAccuracy = r.ClassAccuracy
		if r.ParameterChecksum != 0 {
			s.ParameterChecksum = fmt.Sprintf("%016x", r.ParameterChecksum)
		}
		s.MicroF1, s.MacroF1, s.MeanAveragePrecision = r.MicroF1, r.MacroF1, r.MeanAveragePrecision
		s.RawBytesPerStep, s.SentBytesPerStep = r.RawBytesPerStep, r.SentBytesPerStep
		s.CompressionRatio, s.CompressSeconds = r.CompressionRatio, r.CompressSeconds
		if j.GetSpec().GetPrecision() == "fp16" {
			s.SkippedSteps, s.LossScale = &r.SkippedSteps, r.LossScale
		}
		if k := len(r.ClassAccuracy); k > 0 && len(r.ConfusionMatrix) == k*k {
			for i := range k {
				s.ConfusionMatrix = append(s.ConfusionMatrix, r.ConfusionMatrix[i*k:(i+1)*k])
			}
		}
	}
	if s.Steps == 0 && j.GetProgress() != nil { // ended early: say how far it got
		s.Epochs, s.Steps = j.GetProgress().GetEpoch(), j.GetProgress().GetStep()
	}
	if s.WallSeconds == 0 && j.GetStartedAt() != nil && j.GetFinishedAt() != nil {
		s.WallSeconds = j.GetFinishedAt().AsTime().Sub(j.GetStartedAt().AsTime()).Seconds()
	}
	return s
}

// Writer appends to one run directory. It is safe for concurrent use.
type Writer struct {
	dir string
	mu  sync.Mutex // guards f
	f   *os.File
}

// Create makes dir (runs/<job-id>) and writes spec.json.
func Create(dir string, spec *pb.JobSpec) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("runlog: %w", err)
	}
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: false}.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("runlog: spec: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "spec.json"), append(b, '\n')); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("runlog: %w", err)
	}
	return &Writer{dir: dir, f: f}, nil
}

// Dir is the run directory.
func (w *Writer) Dir() string { return w.dir }

// Log appends one JSON object as a line of metrics.jsonl.
func (w *Writer) Log(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("runlog: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return fmt.Errorf("runlog: %s is closed", w.dir)
	}
	_, err = w.f.Write(append(b, '\n'))
	return err
}

// Finish writes summary.json and closes metrics.jsonl.
func (w *Writer) Finish(s Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("runlog: %w", err)
	}
	werr := writeFileAtomic(filepath.Join(w.dir, "summary.json"), append(b, '\n'))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		if err := w.f.Close(); werr == nil {
			werr = err
		}
		w.f = nil
	}
	return werr
}

// writeFileAtomic writes through a temporary file and a rename, so readers
// never see half a file.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("runlog: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("runlog: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("runlog: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("runlog: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("runlog: %w", err)
	}
	return nil
}
