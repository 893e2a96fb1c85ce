package worker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gradsync/gradsync/pipeline"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// stageFigures are a pipeline stage's figures over its task so far, for
// progress reports (Progress fields 180–186; gradsync watch shows them).
type stageFigures struct {
	stage, stages, replica int
	// stepSeconds is the mean wall time of the stage's steps (to the end
	// of the step's flush on every stage); idle the share of it the stage
	// did not compute.
	stepSeconds, idle   float64
	peakInFlight        int
	peakActivationBytes int64
}

// fill writes the figures into p (nothing for a nil f).
func (f *stageFigures) fill(p *pb.Progress) {
	if f == nil {
		return
	}
	p.PipelineStage, p.PipelineStages, p.PipelineReplica = int32(f.stage), int32(f.stages), int32(f.replica)
	p.StageStepSeconds, p.StageIdleFraction = f.stepSeconds, f.idle
	p.StagePeakInFlight, p.StagePeakActivationBytes = int32(f.peakInFlight), f.peakActivationBytes
}

// figures are the stage's figures for progress reports.
func (p *pipeTask) figures() *stageFigures {
	s := p.summary()
	f := &stageFigures{stage: s.Stage, stages: s.Stages, replica: s.Replica, idle: s.IdleFraction,
		peakInFlight: s.PeakInFlight, peakActivationBytes: s.PeakActivationBytes}
	if s.Steps > 0 {
		f.stepSeconds = s.WallSeconds / float64(s.Steps)
	}
	return f
}

// stageSummary is one pipeline stage's figures over its task, written
// as <runs-dir>/<job-id>/pipeline-rank-<r>.json on its worker: the
// stage's own timeline (busy in forwards and backwards, idle the rest of
// its steps' time, the bubble), the micro-batches it held at once, and
// the activation and gradient bytes it exchanged with each neighbour.
type stageSummary struct {
	Rank         int     `json:"rank"`
	Replica      int     `json:"replica"`
	Stage        int     `json:"stage"`
	Stages       int     `json:"stages"`
	Replicas     int     `json:"replicas"`
	Schedule     string  `json:"schedule"`
	MicroBatches int     `json:"micro_batches"`
	Steps        int64   `json:"steps"`
	BusySeconds  float64 `json:"busy_seconds"`
	WallSeconds  float64 `json:"wall_seconds"`
	// IdleFraction is 1 − busy/wall over the stage's steps;
	// ExpectedBubble is (S−1)/(M+S−1), the schedule's bubble with equal
	// stages and free transfers.
	IdleFraction   float64 `json:"idle_fraction"`
	ExpectedBubble float64 `json:"expected_bubble"`
	PeakInFlight   int     `json:"peak_in_flight"`
	// Bytes per step of tensor data, by neighbour and direction.
	BytesToPrevPerStep   int64 `json:"bytes_to_prev_per_step"`
	BytesFromPrevPerStep int64 `json:"bytes_from_prev_per_step"`
	BytesToNextPerStep   int64 `json:"bytes_to_next_per_step"`
	BytesFromNextPerStep int64 `json:"bytes_from_next_per_step"`
	// PeakActivationBytes is what the stage's in-flight micro-batches'
	// boundary tensors hold at the peak: PeakInFlight micro-batches of
	// the stage's output activation (models keep more inside a stage).
	PeakActivationBytes int64 `json:"peak_activation_bytes"`
	// ParamsHeld and BufferValuesHeld are the lengths of the flat
	// parameter (and gradient) and buffer arrays the stage's worker
	// allocated: its stage's alone (models.NewStage); ScratchValues the
	// one tensor the other stages' layers point at, for their shapes.
	ParamsHeld       int `json:"params_held"`
	BufferValuesHeld int `json:"buffer_values_held"`
	ScratchValues    int `json:"scratch_values"`
}

func (p *pipeTask) summary() stageSummary {
	s := p.ps
	n := max(s.steps, 1)
	out := p.exec.OutShape()
	return stageSummary{Rank: p.coord.Rank, Replica: p.coord.Replica, Stage: p.coord.Stage, Stages: p.coord.Stages, Replicas: p.coord.Replicas,
		Schedule: string(p.plan.Schedule), MicroBatches: p.plan.MicroBatches, Steps: s.steps,
		BusySeconds: s.busy.Seconds(), WallSeconds: s.wall.Seconds(), IdleFraction: s.bubble(),
		ExpectedBubble: pipeline.Bubble(p.coord.Stages, p.plan.MicroBatches), PeakInFlight: s.peakInFlight,
		BytesToPrevPerStep: s.bytesToPrev / n, BytesFromPrevPerStep: s.bytesFromPrev / n,
		BytesToNextPerStep: s.bytesToNext / n, BytesFromNextPerStep: s.bytesFromN / n,
		PeakActivationBytes: int64(s.peakInFlight) * int64(out[0]*out[1]) * 4,
		ParamsHeld:          p.net.NumParams(), BufferValuesHeld: len(p.net.Buffers()), ScratchValues: p.net.ScratchLen()}
}

// report logs the stage's figures and writes them to its worker's run
// directory of the job (when the worker has one).
func (p *pipeTask) report() {
	if p.exec == nil || p.ps.steps == 0 {
		return
	}
	sum := p.summary()
	p.env.log.Info("pipeline stage", "job", p.a.JobId, "rank", sum.Rank, "replica", sum.Replica, "stage", sum.Stage,
		"steps", sum.Steps, "idle_fraction", sum.IdleFraction, "expected_bubble", sum.ExpectedBubble,
		"peak_in_flight", sum.PeakInFlight, "peak_activation_bytes", sum.PeakActivationBytes)
	if p.env.runsDir == "" {
		return
	}
	if err := writeStageSummary(filepath.Join(p.env.runsDir, p.a.JobId), sum); err != nil {
		p.env.log.Warn("writing the pipeline stage's summary", "job", p.a.JobId, "err", err)
	}
}

func writeStageSummary(dir string, sum stageSummary) error {
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, fmt.Sprintf("pipeline-rank-%d.json", sum.Rank))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
