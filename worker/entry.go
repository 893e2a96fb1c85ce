package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/agent"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// An entrypoint job's rank: instead of a Trainer, the worker starts the
// job's command (a user's PyTorch script) with torchrun's variables, serves
// it the local agent socket through which it all-reduces over the job's
// ring (mode ring) or through the summation shards the coordinator hosts
// (mode ps), streams its output to the run directory, and ends it when
// the task ends. entryproc.go holds the process side.

// errEntrypointsOff is the refusal of a worker not started with
// --allow-entrypoints.
var errEntrypointsOff = errors.New("this worker does not run entrypoint commands: start it with --allow-entrypoints to allow jobs to run commands on it")

// entryTermGrace is how long a command has to exit after SIGTERM before
// its process group is killed.
const entryTermGrace = 10 * time.Second

// runEntrypoint runs rank a.Rank of an entrypoint job to its end.
func runEntrypoint(ctx context.Context, a *pb.Assignment, env *taskEnv) (res *pb.JobResult, err error) {
	if !env.allowEntrypoints {
		return nil, errEntrypointsOff
	}
	spec := a.GetSpec()
	log := env.log.With("job", a.JobId, "rank", a.Rank)
	timeout := time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second))
	cfg := agent.Config{JobID: a.JobId, Generation: a.Generation, StepTimeout: timeout, Logger: log, Peers: a.Peers}
	var jr *joinedRing // mode ring
	switch mode := spec.GetMode(); mode {
	case "ring":
		if jr, err = joinRing(ctx, a, env); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				// This rank failed: its peers (whose scripts may still
				// run) need nothing more from it, and an orderly shutdown
				// would wait for them. Break the ring at once, so the
				// failure is reported now, not after the shutdown timeout.
				jr.abort()
				return
			}
			jr.leave()
		}()
		cfg.Ring = jr.data
	case "ps":
		var sums *scriptSums
		if sums, err = joinSums(ctx, a, env); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				// As for the ring: the shards fail the other ranks'
				// calls at once, naming this rank.
				sums.abort()
				return
			}
			sums.leave()
		}()
		cfg.Collective = sums.ScriptClient
	default:
		return nil, fmt.Errorf("entrypoint jobs run in mode ring or ps; got %q", mode)
	}
	if cfg.Compression, err = jobspec.CompressionScheme(spec.GetCompression(), spec.GetSeed()); err != nil {
		return nil, err
	}
	rep := newEntryReports(a, env.rep)
	cfg.Report = rep.report
	srv, err := agent.New(cfg)
	if err != nil {
		return nil, err
	}
	rep.compression = func() agent.CompressionStats {
		st := srv.CompressionStats()
		env.metrics.ObserveCompression(a.JobId, metrics.CompressionTotals{RawBytes: st.RawBytes, SentBytes: st.SentBytes, Seconds: st.CompressSeconds})
		return st
	}
	sock, stopAgent, err := startAgent(ctx, log, func(ctx context.Context, k *agent.Socket) error { return k.Serve(ctx, srv, log) })
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	defer func() {
		stopAgent()
		wg.Wait()
		srv.Close() // its shared memory, once no call is in flight
	}()

	logPath := filepath.Join(env.runsDir, a.JobId, fmt.Sprintf("rank-%d.log", a.Rank))
	vars := scriptVars(a, sock.Path)
	// The job's checkpoint folder, where gradsync.torch.save_checkpoint
	// puts the script's state, and for a resumed job (submit --resume)
	// the file the job before it saved last.
	// Absolute: the command may run in another folder (working_dir).
	for k, p := range map[string]string{"GRADSYNC_CHECKPOINT_DIR": a.CheckpointDir, "GRADSYNC_RESUME_FROM": a.ResumeFrom} {
		if p == "" {
			continue
		}
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		vars[k] = p
	}
	p := entryProcess{
		command: spec.GetEntrypoint().GetCommand(),
		dir:     spec.GetEntrypoint().GetWorkingDir(),
		env:     entryEnv(os.Environ(), spec.GetEntrypoint().GetEnv(), vars),
		logPath: logPath,
		grace:   entryTermGrace,
	}
	start := time.Now()
	log.Info("starting entrypoint", "command", strings.Join(p.command, " "), "log", logPath)
	pctx, stopScript := context.WithCancelCause(ctx)
	defer stopScript(nil) // before the agent's defer: ends the watcher
	if jr != nil {
		// Mode ps needs no watcher: the shards name the rank whose script
		// made no call, and the coordinator then stops its task.
		wg.Add(1)
		go func() { // owned by runEntrypoint: watches for a hung script until it ends
			defer wg.Done()
			if hung := watchHung(pctx, jr.grpc, srv, timeout, time.Now); hung != nil {
				log.Warn("stopping a hung entrypoint", "why", hung)
				stopScript(hung)
			}
		}()
	}
	err = p.run(pctx)
	var hung *hungScript
	if errors.As(context.Cause(pctx), &hung) {
		err = hung // stopped by the watcher, whatever its exit status
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("entrypoint stopped: %w", ctx.Err())
		}
		msg := fmt.Sprintf("rank %d on worker %s: %v", a.Rank, env.worker, err)
		// A call of its own that it cancelled by exiting leaves the
		// agent failed with Canceled: the ring was not at fault.
		aerr := srv.Err()
		ringFailed := aerr != nil && status.Code(aerr) != codes.Canceled
		if ringFailed && hung == nil {
			via := "ring"
			if jr == nil {
				via = "parameter server"
			}
			msg += fmt.Sprintf(" (the agent's %s failed first: %v)", via, aerr)
		}
		if tail := p.stderrTail(); tail != "" {
			msg += "; last lines of its stderr:\n" + tail
		}
		if hung != nil || (!ringFailed && (jr == nil || jr.brokenErr() == nil)) {
			// Its own command failed while its ring was whole (or it
			// hung while its peers waited): the cause, not a victim.
			return nil, &commandFailed{msg: msg}
		}
		return nil, errors.New(msg)
	}
	res = rep.result()
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// commandFailed is the error of an entrypoint rank whose own command
// failed (TaskDone.command_failed): it exited non-zero or crashed while
// its ring was whole, or it hung while its peers waited.
type commandFailed struct{ msg string }

func (e *commandFailed) Error() string { return e.msg }

// hungScript is why the watcher stopped a script: its peers broke the
// ring while it had made no collective call for about the step timeout
// (hungFraction of it), so the others gave up waiting for it.
type hungScript struct {
	idle    time.Duration
	last    string
	timeout time.Duration
	cause   error
}

func (h *hungScript) Error() string {
	last := "none"
	if h.last != "" {
		last = h.last
	}
	return fmt.Sprintf("its script had made no collective call for %v (the last: %s; the step timeout is %v) when its peers broke the ring (%v): stopped as hung",
		h.idle.Round(100*time.Millisecond), last, h.timeout, h.cause)
}

// brokenRing is a ring that tells when a neighbour broke it while this
// rank made no call (ringrpc's does).
type brokenRing interface {
	Broken() <-chan struct{}
	BrokenErr() error
}

// hungFraction is how much of the step timeout a script must have been
// idle for when its ring breaks to be called hung. Its peers give up on
// it after waiting the whole step timeout in a collective they entered
// as its last call ended (give or take the ring's latency), so a hung
// script has been idle for about that long; a healthy one that computes
// without collectives (an evaluation) while a peer crashes is idle for
// less, unless it computes for most of the step timeout. Such a script
// would be evicted from an elastic job with the crashed one. The 20 %
// margin covers the ranks' skew at their last call and a loaded machine.
const hungFraction = 0.8

// watchHung waits until ctx ends or ring breaks. A script that has made
// no collective call for about the step timeout when its peers break the
// ring is the one they gave up waiting for: watchHung returns why, and
// its rank reports it with its worker and its stderr, which its peers
// cannot (now is the clock). A script that was calling learns of the
// break from its next call and exits on its own (nil).
func watchHung(ctx context.Context, ring brokenRing, srv *agent.Server, timeout time.Duration, now func() time.Time) *hungScript {
	select {
	case <-ring.Broken():
	case <-ctx.Done():
		return nil
	}
	idle, last := srv.Idle(now())
	if idle < time.Duration(hungFraction*float64(timeout)) {
		return nil
	}
	return &hungScript{idle: idle, last: last, timeout: timeout, cause: ring.BrokenErr()}
}

// localRanks is a rank's LOCAL_RANK and LOCAL_WORLD_SIZE: its place among
// the ranks whose peer address has the same host.
func localRanks(peers []string, rank int) (local, world int) {
	if rank < 0 || rank >= len(peers) {
		return 0, 1
	}
	host := func(addr string) string {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			return h
		}
		return addr
	}
	mine := host(peers[rank])
	for i, p := range peers {
		if host(p) == mine {
			if i < rank {
				local++
			}
			world++
		}
	}
	return local, world
}

// entryEnv is the command's environment: the worker's own less every
// GRADSYNC_ variable (the worker's token and settings: the job's
// environment never carries its credentials) and less the variables set,
// then the job's env, then set.
func entryEnv(base []string, job, set map[string]string) []string {
	var out []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GRADSYNC_") {
			continue
		}
		if _, ok := set[k]; ok {
			continue
		}
		if _, ok := job[k]; ok {
			continue
		}
		out = append(out, kv)
	}
	for _, m := range []map[string]string{job, set} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			out = append(out, k+"="+m[k])
		}
	}
	return out
}

// entryReports turns a script's Report calls into the task's reports to
// the coordinator, and keeps what its result needs.
type entryReports struct {
	a     *pb.Assignment
	rep   *reporter
	start time.Time
	// compression returns the agent's compression counters (nil: none).
	compression func() agent.CompressionStats
	// mu protects last.
	mu   sync.Mutex
	last pb.JobResult
}

func newEntryReports(a *pb.Assignment, rep *reporter) *entryReports {
	return &entryReports{a: a, rep: rep, start: time.Now()}
}

func (e *entryReports) report(m *pb.ReportRequest) {
	e.mu.Lock()
	e.last.Epochs, e.last.Steps = m.GetEpoch(), m.GetStep()
	if m.GetImagesPerSecond() > 0 {
		e.last.ImagesPerSecond = m.GetImagesPerSecond()
	}
	if m.GetLoss() != 0 {
		e.last.TrainLoss = m.GetLoss()
	}
	if m.GetEval() || m.GetFinal() {
		e.last.TestAccuracy, e.last.TestLoss = m.GetTestAccuracy(), m.GetTestLoss()
		if m.GetTrainLoss() != 0 {
			e.last.TrainLoss = m.GetTrainLoss()
		}
	}
	e.mu.Unlock()
	a := e.a
	if e.rep == nil {
		return
	}
	if m.GetEval() {
		e.rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Eval{Eval: &pb.TaskEval{JobId: a.JobId, Rank: a.Rank, Generation: a.Generation,
			Epoch: m.GetEpoch(), Step: m.GetStep(), TestAccuracy: m.GetTestAccuracy(), TestLoss: m.GetTestLoss(), TrainLoss: m.GetTrainLoss()}}})
		return
	}
	if !m.GetFinal() {
		p := &pb.Progress{Epoch: m.GetEpoch(), Step: m.GetStep(), TotalSteps: m.GetTotalSteps(), Loss: m.GetLoss(),
			ImagesPerSecond: m.GetImagesPerSecond(), LearningRate: m.GetLearningRate(), ElapsedSeconds: time.Since(e.start).Seconds()}
		if c := e.compressionStats(); c.Steps > 0 && c.SentBytes > 0 {
			p.SentBytesPerStep = float64(c.SentBytes) / float64(c.Steps)
			p.CompressionRatio = float64(c.RawBytes) / float64(c.SentBytes)
		}
		e.rep.trySend(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Progress{Progress: &pb.TaskProgress{JobId: a.JobId, Generation: a.Generation, Rank: a.Rank,
			Progress: p}}})
	}
}

func (e *entryReports) compressionStats() agent.CompressionStats {
	if e.compression == nil {
		return agent.CompressionStats{}
	}
	return e.compression()
}

// result is the rank's result from what the script reported.
func (e *entryReports) result() *pb.JobResult {
	c := e.compressionStats()
	e.mu.Lock()
	defer e.mu.Unlock()
	res := &pb.JobResult{TestAccuracy: e.last.TestAccuracy, TestLoss: e.last.TestLoss, TrainLoss: e.last.TrainLoss,
		Epochs: e.last.Epochs, Steps: e.last.Steps, ImagesPerSecond: e.last.ImagesPerSecond}
	// The gradient buckets' traffic per step (compressed jobs), as the
	// Go engine's ring ranks report it.
	if c.Steps > 0 && c.SentBytes > 0 {
		res.RawBytesPerStep = float64(c.RawBytes) / float64(c.Steps)
		res.SentBytesPerStep = float64(c.SentBytes) / float64(c.Steps)
		res.CompressionRatio = float64(c.RawBytes) / float64(c.SentBytes)
		res.CompressSeconds = c.CompressSeconds
	}
	return res
}

// startAgent makes an agent socket and serves it with serve in a
// goroutine until stop, which waits for it.
func startAgent(ctx context.Context, log *slog.Logger, serve func(context.Context, *agent.Socket) error) (sock *agent.Socket, stop func(), err error) {
	sock, err = agent.Listen("")
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // owned by startAgent's caller through stop: the agent, stopped once the command has ended
		defer close(done)
		if err := serve(ctx, sock); err != nil {
			log.Warn("agent socket", "err", err)
		}
	}()
	return sock, func() { cancel(); <-done }, nil
}

// scriptVars are the variables a worker sets for its rank's command:
// torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), the agent's
// socket, the job, the generation (1 at the start, one more for each
// elastic restart) and, for scripts written for torchrun, its restart
// count: a restarted script loads the state it saved.
func scriptVars(a *pb.Assignment, agentPath string) map[string]string {
	localRank, localWorld := localRanks(a.Peers, int(a.Rank))
	return map[string]string{
		"RANK": strconv.Itoa(int(a.Rank)), "WORLD_SIZE": strconv.Itoa(int(a.WorldSize)),
		"LOCAL_RANK": strconv.Itoa(localRank), "LOCAL_WORLD_SIZE": strconv.Itoa(localWorld),
		"GRADSYNC_AGENT": agentPath, "GRADSYNC_JOB_ID": a.JobId,
		"GRADSYNC_GENERATION":        strconv.FormatUint(a.Generation, 10),
		"TORCHELASTIC_RESTART_COUNT": strconv.FormatUint(max(a.Generation, 1)-1, 10),
	}
}
