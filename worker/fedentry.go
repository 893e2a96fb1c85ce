package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gradsync/gradsync/agent"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// A fedavg entrypoint job's rank (workers ≥ 2): the worker starts the
// job's command — a script that defines a gradsync.fl.Client and calls
// gradsync.fl.start — serves it the FedAgent service on the agent socket,
// and takes part in the job's rounds as its client (fedClient), with the
// script as its learner (scriptLearner): the rounds, the models' frames,
// the updates and the evaluations are those of a Go client.
//
// The script must join (send its layout and initial parameters) within
// jobspec.FedJoinWait of its start, or the task fails with its stderr: a
// script that cannot start is a broken job, not a lost client. Once it
// has joined, a script that exits before the rounds are over, or does not
// answer a fit or evaluation within the round deadline, is stopped and
// its client leaves the job: it is lost, as a lost worker's client is
// (missing from the rounds it is sampled for; the job fails only when
// every client is lost), named with its stderr in the job's events.

// runFedEntrypoint runs client a.Rank of a fedavg entrypoint job.
func runFedEntrypoint(ctx context.Context, a *pb.Assignment, env *taskEnv) (*pb.JobResult, error) {
	if !env.allowEntrypoints {
		return nil, errEntrypointsOff
	}
	spec := a.GetSpec()
	f := spec.GetFederated()
	log := env.log.With("job", a.JobId, "client", a.Rank)
	deadline := time.Duration(f.GetRoundDeadlineSeconds() * float64(time.Second))
	fs := agent.NewFed(agent.FedConfig{JobID: a.JobId, Client: int(a.Rank), NumClients: int(a.WorldSize), Rounds: int(f.GetRounds())})
	sock, stopAgent, err := startAgent(ctx, log, func(ctx context.Context, k *agent.Socket) error { return k.ServeFed(ctx, fs, log) })
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	defer func() {
		stopAgent()
		wg.Wait()
	}()

	p := entryProcess{
		command: spec.GetEntrypoint().GetCommand(),
		dir:     spec.GetEntrypoint().GetWorkingDir(),
		env:     entryEnv(os.Environ(), spec.GetEntrypoint().GetEnv(), scriptVars(a, sock.Path)),
		logPath: filepath.Join(env.runsDir, a.JobId, fmt.Sprintf("rank-%d.log", a.Rank)),
		grace:   entryTermGrace,
	}
	log.Info("starting federated entrypoint", "command", strings.Join(p.command, " "), "log", p.logPath)
	pctx, stopScript := context.WithCancelCause(ctx)
	defer stopScript(nil) // before the agent's defer: ends the script
	// exited is done once the script has exited; its cause says how.
	exited, markExited := context.WithCancelCause(context.Background())
	wg.Add(1)
	go func() { // owned by runFedEntrypoint: the script, stopped by stopScript
		defer wg.Done()
		err := p.run(pctx)
		if err == nil {
			err = fmt.Errorf("%s exited (status 0)", p.command[0])
		}
		if cause := context.Cause(pctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w (stopped: %v)", err, cause)
		}
		markExited(err)
	}()
	stderr := func() string {
		if tail := p.stderrTail(); tail != "" {
			return "; last lines of its stderr:\n" + tail
		}
		return ""
	}

	// The script joins within the longer of the round deadline and the
	// step timeout of its start.
	joinWait := jobspec.FedJoinWait(spec)
	t := time.NewTimer(joinWait)
	defer t.Stop()
	select {
	case <-fs.Joined():
	case <-exited.Done():
		return nil, &commandFailed{msg: fmt.Sprintf("client %d on worker %s: its script ended before it joined (gradsync.fl.start): %v%s",
			a.Rank, env.worker, context.Cause(exited), stderr())}
	case <-t.C:
		stopScript(errors.New("it did not join in time"))
		<-exited.Done()
		return nil, &commandFailed{msg: fmt.Sprintf("client %d on worker %s: its script did not join (gradsync.fl.start) within %v (the longer of the round deadline and the step timeout)%s",
			a.Rank, env.worker, joinWait, stderr())}
	case <-ctx.Done():
		return nil, fmt.Errorf("entrypoint stopped: %w", ctx.Err())
	}
	j := fs.Joining()
	log.Info("federated script joined", "tensors", len(j.Layout), "params", len(j.Initial))
	l := &scriptLearner{fs: fs, exited: exited, stop: stopScript, evalDeadline: deadline, stderr: stderr}
	start := time.Now()
	res, err := newFedClient(a, env, l, fedJoin{numParams: len(j.Initial), layout: j.Layout, initial: j.Initial}, &pb.JobResult{}).run(ctx)

	// The rounds are over (or this client failed): the script hears so
	// from its next task and has the grace to exit.
	msg := "the job's rounds are over"
	if err != nil {
		msg = err.Error()
	}
	fs.Finish(msg)
	grace := time.NewTimer(entryTermGrace)
	defer grace.Stop()
	select {
	case <-exited.Done():
	case <-grace.C:
		stopScript(errors.New("it did not exit after the job's rounds were over"))
		<-exited.Done()
	}
	if err != nil {
		return nil, err
	}
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// scriptLearner is a fedLearner that hands each fit and evaluation to
// the script through the agent (agent.FedServer) and waits for its
// answer: until the round's deadline (a fit) or the round deadline (an
// evaluation), and no longer than the script runs.
type scriptLearner struct {
	fs *agent.FedServer
	// exited is done once the script has exited (its cause says how).
	exited context.Context
	// stop stops the script (one that is gone) with a cause.
	stop         context.CancelCauseFunc
	evalDeadline time.Duration
	// stderr is "; last lines of its stderr: …", or "".
	stderr func() string
}

// fit implements fedLearner: the script's fit, from its new parameters.
func (l *scriptLearner) fit(ctx context.Context, rs *pb.RoundStart, global, delta []float32) (fitResult, error) {
	d := time.Duration(rs.DeadlineSeconds * float64(time.Second))
	cfg := map[string]float64{"round": float64(rs.Round), "local_epochs": float64(rs.LocalEpochs), "batch_size": float64(rs.LocalBatchSize),
		"lr": rs.ClientLr, "mu": rs.Mu, "deadline_seconds": rs.DeadlineSeconds}
	r, err := l.call(ctx, d, func(ctx context.Context) (*agent.FedResult, error) { return l.fs.Fit(ctx, rs.Round, cfg, global) })
	if err != nil {
		return fitResult{}, err
	}
	for i, p := range r.Params {
		delta[i] = p - global[i]
	}
	return fitResult{numExamples: r.NumExamples, loss: r.Loss, metrics: r.Metrics}, nil
}

// evaluate implements fedLearner: the script's evaluate.
func (l *scriptLearner) evaluate(ctx context.Context, round int32, global []float32) (*pb.ClientEval, error) {
	cfg := map[string]float64{"round": float64(round), "deadline_seconds": l.evalDeadline.Seconds()}
	r, err := l.call(ctx, l.evalDeadline, func(ctx context.Context) (*agent.FedResult, error) { return l.fs.Evaluate(ctx, round, cfg, global) })
	if err != nil {
		return nil, err
	}
	return &pb.ClientEval{Round: round, TestAccuracy: r.Accuracy, TestLoss: r.Loss, TestExamples: r.NumExamples, Metrics: r.Metrics}, nil
}

// call runs one task of the script within d and while the script runs. A
// script that exits or does not answer in time is gone: it is stopped,
// and the error (a *fedLearnerGone) says why, with its stderr.
func (l *scriptLearner) call(ctx context.Context, d time.Duration, task func(context.Context) (*agent.FedResult, error)) (*agent.FedResult, error) {
	tctx, cancel := context.WithTimeoutCause(ctx, d, fmt.Errorf("its deadline of %v passed", d.Round(10*time.Millisecond)))
	defer cancel()
	sctx, cancelS := context.WithCancelCause(tctx)
	defer cancelS(nil)
	stopWatch := context.AfterFunc(l.exited, func() { cancelS(context.Cause(l.exited)) })
	defer stopWatch()
	r, err := task(sctx)
	if err == nil {
		return r, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // the task was cancelled: not the script's fault
	}
	l.stop(err)
	return nil, &fedLearnerGone{reason: err.Error() + l.stderr()}
}
