package main

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/internal/security"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The --json lines of every command, in one vocabulary (the README's
// "Machine-readable output" table, which TestJSONVocabulary holds these
// types to): the same thing has the same name everywhere — a job is
// job_id, a worker worker_id, a job state PENDING/RUNNING/SUCCEEDED/
// FAILED/CANCELLED and a worker state IDLE/BUSY/LOST (never the enums'
// JOB_STATE_/WORKER_STATE_ spellings), steps are step/steps/total_steps,
// accuracy test_accuracy. Event lines carry "event"; a job's summary is
// runlog.Summary, the object summary.json holds.

// jobLine is a job as `jobs`, `submit` (without --watch) and `cancel`
// print it: its summary so far, and when it happened and on which workers.
type jobLine struct {
	runlog.Summary
	WorkerIDs  []string   `json:"worker_ids,omitempty"`
	CreatedAt  *time.Time `json:"created_at,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

func jobLineOf(j *pb.Job) jobLine {
	at := func(ts *timestamppb.Timestamp) *time.Time {
		if ts == nil {
			return nil
		}
		t := ts.AsTime()
		return &t
	}
	return jobLine{Summary: runlog.SummaryOf(j), WorkerIDs: j.GetWorkerIds(),
		CreatedAt: at(j.GetCreatedAt()), StartedAt: at(j.GetStartedAt()), FinishedAt: at(j.GetFinishedAt())}
}

// workerLine is one worker of `workers`.
// logLine is one line of an entrypoint command's output (`logs --json`).
type logLine struct {
	Event   string `json:"event"`
	JobID   string `json:"job_id"`
	Rank    int    `json:"rank"`
	Message string `json:"message"`
}

type workerLine struct {
	WorkerID      string    `json:"worker_id"`
	Name          string    `json:"name,omitempty"`
	State         string    `json:"state"`
	Address       string    `json:"address"`
	CPUCores      int32     `json:"cpu_cores"`
	GPUs          int       `json:"gpus"`
	GemmBackend   string    `json:"gemm_backend,omitempty"`
	JobID         string    `json:"job_id,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// MemoryBytes is what the worker offers to a task (0: not reported).
	MemoryBytes uint64 `json:"memory_bytes"`
}

func workerLineOf(w *pb.Worker) workerLine {
	return workerLine{WorkerID: w.GetId(), Name: w.GetName(), State: workerStateName(w.GetState()), Address: w.GetAddress(),
		CPUCores: w.GetResources().GetCpuCores(), GPUs: len(w.GetResources().GetGpus()),
		GemmBackend: w.GetResources().GetGemmBackend(), JobID: w.GetJobId(), LastHeartbeat: w.GetLastHeartbeat().AsTime(), MemoryBytes: w.GetMemoryBytes()}
}

// stateEvent: the job changed state.
type stateEvent struct {
	Event   string    `json:"event"` // "state"
	JobID   string    `json:"job_id"`
	State   string    `json:"state"`
	Message string    `json:"message,omitempty"`
	Time    time.Time `json:"time"`
}

// progressEvent: the job's progress (rank 0's view, as the human line).
type progressEvent struct {
	Event           string  `json:"event"` // "progress"
	JobID           string  `json:"job_id"`
	Epoch           int32   `json:"epoch"`
	Epochs          int32   `json:"epochs"`
	Step            int64   `json:"step"`
	TotalSteps      int64   `json:"total_steps"`
	Loss            float64 `json:"loss"`
	ImagesPerSecond float64 `json:"images_per_second"`
	// LoaderImagesPerSecond: rank 0's data loader capacity (streamed data
	// sets only), beside images_per_second.
	LoaderImagesPerSecond float64 `json:"loader_images_per_second,omitempty"`
	EtaSeconds            float64 `json:"eta_seconds"`
	ElapsedSeconds        float64 `json:"elapsed_seconds"`
	LearningRate          float64 `json:"learning_rate"`
	// Stages: a pipeline job's figures per stage rank, from each rank's
	// latest report (omitted for other jobs).
	Stages []stageLine `json:"stages,omitempty"`
}

// stageLine is one pipeline stage rank's figures over its task so far
// (Progress fields 180–186).
type stageLine struct {
	Rank                int     `json:"rank"`
	Stage               int32   `json:"stage"`
	Replica             int32   `json:"replica"`
	StepSeconds         float64 `json:"step_seconds"`
	IdleFraction        float64 `json:"idle_fraction"`
	PeakInFlight        int32   `json:"peak_in_flight"`
	PeakActivationBytes int64   `json:"peak_activation_bytes"`
}

// stageLines are j's pipeline stage ranks' figures (nil for other jobs,
// and before a stage reported).
func stageLines(j *pb.Job) []stageLine {
	var out []stageLine
	for r, p := range j.GetRanks() {
		if p.GetPipelineStages() == 0 {
			continue
		}
		out = append(out, stageLine{Rank: r, Stage: p.PipelineStage, Replica: p.PipelineReplica, StepSeconds: p.StageStepSeconds,
			IdleFraction: p.StageIdleFraction, PeakInFlight: p.StagePeakInFlight, PeakActivationBytes: p.StagePeakActivationBytes})
	}
	return out
}

// String is the stage's figures for humans.
func (s stageLine) String() string {
	return fmt.Sprintf("stage %d replica %d: %.0fms/step  idle %.1f%%  ≤%d micro-batches in flight  activations %s",
		s.Stage, s.Replica, 1000*s.StepSeconds, 100*s.IdleFraction, s.PeakInFlight, memoryColumn(uint64(s.PeakActivationBytes)))
}

// evalEvent: a test-set evaluation (after an epoch, or a fedavg round).
type evalEvent struct {
	Event        string  `json:"event"` // "eval"
	JobID        string  `json:"job_id"`
	Epoch        int32   `json:"epoch"`
	TestAccuracy float64 `json:"test_accuracy"`
	TestLoss     float64 `json:"test_loss"`
}

// logEvent: a message of the job's (recoveries, stragglers, cut links).
type logEvent struct {
	Event   string `json:"event"` // "log"
	JobID   string `json:"job_id"`
	Message string `json:"message"`
}

// listeningEvent: a server or worker started with --json is listening.
type listeningEvent struct {
	Event   string `json:"event"` // "listening"
	Address string `json:"address"`
}

// certsLine is what `certs init` wrote.
type certsLine struct {
	Dir        string `json:"dir"`
	CA         string `json:"ca"`
	CAKey      string `json:"ca_key"`
	ServerCert string `json:"server_cert"`
	ServerKey  string `json:"server_key"`
	WorkerCert string `json:"worker_cert"`
	WorkerKey  string `json:"worker_key"`
	Token      string `json:"token"`
}

func certsLineOf(p security.Paths) certsLine {
	return certsLine{Dir: p.Dir, CA: p.CA, CAKey: p.CAKey, ServerCert: p.ServerCert, ServerKey: p.ServerKey,
		WorkerCert: p.WorkerCert, WorkerKey: p.WorkerKey, Token: p.Token}
}

// workerStateName is the short name of a worker state ("IDLE").
func workerStateName(s pb.WorkerState) string {
	return strings.TrimPrefix(s.String(), "WORKER_STATE_")
}

// memoryColumn is a worker's offered memory for `gradsync workers`:
// "15.6GiB", "512MiB", "-" when not reported.
func memoryColumn(b uint64) string {
	switch {
	case b == 0:
		return "-"
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.0fKiB", float64(b)/(1<<10))
}
