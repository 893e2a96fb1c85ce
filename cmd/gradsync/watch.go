package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gradsync/gradsync/internal/runlog"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// printer writes job events for humans (text) or machines (one JSON object
// per line).
type printer struct {
	out  io.Writer
	json bool
	// lastProgress throttles human progress lines.
	lastProgress time.Time
	// bars is the height of the live progress block last drawn on a
	// terminal (redrawn in place); 0 when none is on screen.
	bars int
	// endedLine is "<job id> <state>" once a human line said that the job
	// ended, so that the summary does not say it twice.
	endedLine string
}

// ended reports whether s is a final state.
func ended(s pb.JobState) bool {
	return s == pb.JobState_JOB_STATE_SUCCEEDED || s == pb.JobState_JOB_STATE_FAILED || s == pb.JobState_JOB_STATE_CANCELLED
}

// live reports whether human output goes to a terminal, where progress is
// drawn as bars redrawn in place.
func (p *printer) live() bool {
	if p.json {
		return false
	}
	f, ok := p.out.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// drawBars draws the job line and one progress bar per worker, replacing
// the block drawn before.
func (p *printer) drawBars(j *pb.Job) {
	pr := j.GetProgress()
	var b strings.Builder
	if p.bars > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.bars)
	}
	line := func(format string, a ...any) {
		b.WriteString("\x1b[2K")
		fmt.Fprintf(&b, format, a...)
		b.WriteByte('\n')
	}
	line("[%6.1fs] epoch %d/%d  step %d/%d  loss %.4f  %s img/s%s  eta %s", pr.GetElapsedSeconds(), pr.GetEpoch(),
		j.GetSpec().GetEpochs(), pr.GetStep(), pr.GetTotalSteps(), pr.GetLoss(), thousands(pr.GetImagesPerSecond()),
		loaderRate(pr.GetLoaderImagesPerSecond()), (time.Duration(pr.GetEtaSeconds()) * time.Second).String())
	const width = 30
	for r, rp := range j.GetRanks() {
		frac := 0.0
		if rp.GetTotalSteps() > 0 {
			frac = float64(rp.GetStep()) / float64(rp.GetTotalSteps())
		}
		n := int(frac*width + 0.5)
		id := ""
		if r < len(j.GetWorkerIds()) {
			id = j.GetWorkerIds()[r]
		}
		timing := ""
		if c := rp.GetComputeSeconds(); c > 0 {
			// Compute per step, and (ring) the wait for the left neighbour:
			// a straggler's right neighbour waits about its extra time.
			timing = fmt.Sprintf("  compute %.0fms", 1000*c)
			if j.GetSpec().GetMode() == "ring" {
				timing += fmt.Sprintf("  waits %.0fms", 1000*rp.GetLeftWaitSeconds())
			}
		}
		if rp.GetPipelineStages() > 0 {
			st := stageLine{Stage: rp.PipelineStage, Replica: rp.PipelineReplica, StepSeconds: rp.StageStepSeconds, IdleFraction: rp.StageIdleFraction,
				PeakInFlight: rp.StagePeakInFlight, PeakActivationBytes: rp.StagePeakActivationBytes}
			timing += "  " + st.String()
		}
		line("  rank %-2d %-14s [%s%s] %5.1f%%  %s img/s  loss %.4f%s", r, id, strings.Repeat("#", n), strings.Repeat(".", width-n),
			100*frac, thousands(rp.GetImagesPerSecond()), rp.GetLoss(), timing)
	}
	p.bars = 1 + len(j.GetRanks())
	fmt.Fprint(p.out, b.String())
}

func (p *printer) jsonLine(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"error":%q}`, err.Error()))
	}
	fmt.Fprintf(p.out, "%s\n", b)
}

// event prints one job event.
func (p *printer) event(ev *pb.WatchJobResponse) {
	j := ev.GetJob()
	if ev.Kind != pb.EventKind_EVENT_KIND_PROGRESS {
		p.bars = 0 // leave the last bars on screen; print below them
	}
	switch ev.Kind {
	case pb.EventKind_EVENT_KIND_STATE:
		if p.json {
			p.jsonLine(stateEvent{Event: "state", JobID: j.GetId(), State: runlog.StateName(j.GetState()), Message: ev.Message, Time: ev.GetTime().AsTime()})
			return
		}
		if ended(j.GetState()) {
			// The summary block follows right under this line: it does
			// not say it again (see summary).
			fmt.Fprintln(p.out)
			p.endedLine = j.GetId() + " " + runlog.StateName(j.GetState())
		}
		fmt.Fprintf(p.out, "job %s %s", j.GetId(), runlog.StateName(j.GetState()))
		if ev.Message != "" {
			fmt.Fprintf(p.out, ": %s", ev.Message)
		}
		fmt.Fprintln(p.out)
	case pb.EventKind_EVENT_KIND_PROGRESS:
		pr := j.GetProgress()
		if pr == nil {
			return
		}
		if p.json {
			p.jsonLine(progressEvent{Event: "progress", JobID: j.GetId(), Epoch: pr.Epoch, Epochs: j.GetSpec().GetEpochs(),
				Step: pr.Step, TotalSteps: pr.TotalSteps, Loss: pr.Loss, ImagesPerSecond: pr.ImagesPerSecond, LoaderImagesPerSecond: pr.LoaderImagesPerSecond,
				EtaSeconds: pr.EtaSeconds, ElapsedSeconds: pr.ElapsedSeconds, LearningRate: pr.LearningRate, Stages: stageLines(j)})
			return
		}
		if p.live() && j.GetSpec().GetMode() != "fedavg" {
			p.drawBars(j)
			return
		}
		now := time.Now()
		if now.Sub(p.lastProgress) < time.Second && pr.Step != pr.TotalSteps {
			return
		}
		p.lastProgress = now
		pct := 0.0
		if pr.TotalSteps > 0 {
			pct = 100 * float64(pr.Step) / float64(pr.TotalSteps)
		}
		if j.GetSpec().GetMode() == "fedavg" {
			fmt.Fprintf(p.out, "[%6.1fs] round %d/%d  train loss %.4f  eta %s\n", pr.ElapsedSeconds, pr.Step, pr.TotalSteps,
				pr.Loss, (time.Duration(pr.EtaSeconds) * time.Second).String())
			return
		}
		fmt.Fprintf(p.out, "[%6.1fs] epoch %d/%d  step %d/%d (%4.1f%%)  loss %.4f  %s img/s%s  eta %s\n",
			pr.ElapsedSeconds, pr.Epoch, j.GetSpec().GetEpochs(), pr.Step, pr.TotalSteps, pct, pr.Loss,
			thousands(pr.ImagesPerSecond), loaderRate(pr.LoaderImagesPerSecond), (time.Duration(pr.EtaSeconds) * time.Second).String())
		for _, st := range stageLines(j) {
			fmt.Fprintf(p.out, "  rank %-2d %s\n", st.Rank, st)
		}
	case pb.EventKind_EVENT_KIND_EVAL:
		if p.json {
			p.jsonLine(evalEvent{Event: "eval", JobID: j.GetId(), Epoch: ev.Epoch, TestAccuracy: ev.TestAccuracy, TestLoss: ev.TestLoss})
			return
		}
		what := "epoch"
		if j.GetSpec().GetMode() == "fedavg" {
			what = "round"
		}
		fmt.Fprintf(p.out, "%s %d: test accuracy %.2f%%  test loss %.4f\n", what, ev.Epoch, 100*ev.TestAccuracy, ev.TestLoss)
	case pb.EventKind_EVENT_KIND_LOG:
		if p.json {
			p.jsonLine(logEvent{Event: "log", JobID: j.GetId(), Message: ev.Message})
			return
		}
		fmt.Fprintln(p.out, ev.Message)
	}
}

// summary prints a finished job's summary: the last JSON line, or a block of
// text.
func (p *printer) summary(j *pb.Job) {
	s := runlog.SummaryOf(j)
	if p.json {
		p.jsonLine(s)
		return
	}
	if p.endedLine != s.JobID+" "+s.State { // not yet said by the job's last state event
		fmt.Fprintf(p.out, "\njob %s %s", s.JobID, s.State)
		if s.Message != "" {
			fmt.Fprintf(p.out, ": %s", s.Message)
		}
		fmt.Fprintln(p.out)
	}
	if s.Mode == "fedavg" {
		fmt.Fprintf(p.out, "  model %s  dataset %s  mode %s  rounds %d\n", s.Model, s.Dataset, s.Mode, s.Steps)
	} else {
		ds := s.Dataset
		if s.LabelGranularity != "" {
			ds += " (" + s.LabelGranularity + " labels)"
		}
		fmt.Fprintf(p.out, "  model %s  dataset %s  mode %s  workers %d  epochs %d  steps %d\n", s.Model, ds, s.Mode, s.Workers, s.Epochs, s.Steps)
	}
	if s.State == "SUCCEEDED" {
		if s.MicroF1 != 0 || s.MeanAveragePrecision != 0 {
			fmt.Fprintf(p.out, "  micro-F1 %.4f  macro-F1 %.4f  mAP %.4f  exact-match accuracy %.2f%%\n", s.MicroF1, s.MacroF1, s.MeanAveragePrecision, 100*s.TestAccuracy)
		} else {
			fmt.Fprintf(p.out, "  test accuracy %.2f%%  test loss %.4f\n", 100*s.TestAccuracy, s.TestLoss)
		}
	}
	fmt.Fprintf(p.out, "  wall %.1fs  throughput %s img/s%s", s.WallSeconds, thousands(s.ImagesPerSecond), loaderRate(s.LoaderImagesPerSecond))
	if s.GemmBackend != "" {
		fmt.Fprintf(p.out, "  gemm %s", s.GemmBackend)
	}
	fmt.Fprintf(p.out, "\n  run directory %s (metrics.jsonl, summary.json)\n", s.RunDir)
}

// job prints one job for `jobs` and `submit`.
func (p *printer) job(j *pb.Job) {
	if p.json {
		p.jsonLine(jobLineOf(j))
		return
	}
	acc := "-"
	if j.GetState() == pb.JobState_JOB_STATE_SUCCEEDED {
		acc = fmt.Sprintf("%.2f%%", 100*j.GetResult().GetTestAccuracy())
	}
	msg := j.GetMessage()
	if len(msg) > 70 {
		msg = msg[:67] + "..."
	}
	fmt.Fprintf(p.out, "%-28s %-10s %-8s %-14s %-5s %2d  %-8s %s  %s\n", j.GetId(), runlog.StateName(j.GetState()),
		j.GetSpec().GetModel(), j.GetSpec().GetDataset().GetName(), j.GetSpec().GetMode(), j.GetSpec().GetWorkers(), acc,
		j.GetCreatedAt().AsTime().Local().Format("2006-01-02 15:04:05"), msg)
}

// watch follows a job until it ends and returns its final state.
func watch(ctx context.Context, c pb.JobServiceClient, id string, p *printer) (*pb.Job, error) {
	stream, err := c.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		return nil, err
	}
	var last *pb.Job
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return last, err
		}
		last = ev.GetJob()
		p.event(ev)
	}
	if last == nil {
		return nil, fmt.Errorf("job %s: the watch stream ended without events", id)
	}
	return last, nil
}

// thousands formats n with thousands separators: 12,345.
func thousands(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// loaderRate is the progress lines' "(loader N img/s)" for the streamed
// data sets, or nothing.
func loaderRate(v float64) string {
	if v <= 0 {
		return ""
	}
	return " (loader " + thousands(v) + " img/s)"
}
