package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// A fedavg job with real clients (workers ≥ 2, jobspec.RealClients) runs
// its rounds here: the coordinator holds the federated.Server state
// machine and feeds it wall-clock time, and every worker is one client
// (client index = rank) on a Federation.Participate stream.
//
//   - The first round opens when every client has joined (or is lost), or
//     one round deadline after the job started with those that have.
//   - Each round, every connected client hears of it (RoundStart); the
//     sampled ones get the global model and train. A sampled client that
//     is not connected, or never answers, is missing when the round closes
//     at its deadline; a round with fewer than min_clients answers fails,
//     and so does the job (as in the simulation).
//   - An update for a round that has closed is refused with Aborted and
//     counted (late when its client was sampled and missing); the client
//     joins again for later rounds.
//   - The coordinator has no data of its own, so the global model is
//     evaluated by the evaluator: the connected client with the lowest
//     index (client 0 while it is up), on its own test split, after every
//     eval_every_rounds closed rounds and after the last. Its results are
//     recorded as the simulation's are (metrics.jsonl round records,
//     charts, events); the job ends SUCCEEDED with the final evaluation.
//   - A worker lost is a client missing from the rounds it is sampled
//     for, not a failure; the job fails only when every client is gone.
//     A round does not wait for its lost clients: it closes as soon as the
//     others have answered (federated.Server.Drop), before its deadline.
//   - With checkpoints the coordinator writes one after a closed round
//     when the spec says (jobspec.CheckpointDue; a round is a step and an
//     epoch, every_seconds is checked as rounds close), and when the job
//     is cancelled or fails or the server shuts down: the simulation's
//     format (federated.SaveCheckpoint) — the global parameters, the
//     server optimiser's state, the rounds closed. The coordinator has no
//     batch-norm statistics of its own (each client keeps its running
//     mean and variance): a checkpoint holds the buffers the job started
//     with (the model's initial ones, or those of the checkpoint it
//     resumed from), and a resumed job's clients start theirs afresh.
//   - A resume (submit --resume, or a server restart's requeue) starts the
//     rounds after the checkpoint's with its global model and server
//     state, once the clients join again; with every client answering it
//     is the undisturbed run, bit for bit, on models without batch norm.
//     The evaluation of a round that closed before the checkpoint but was
//     not yet recorded is lost, except the last round's, which a resumed
//     job asks for before it ends.

// fedOutbox bounds the messages queued for one client; a client that lets
// this many pile up is not reading and is dropped (it misses its rounds).
const fedOutbox = 32

// maxLabelClasses bounds label histograms from the network.
const maxLabelClasses = 256

// fedJob is the round driver of one running fedavg job with real clients.
// Fields after mu's comment are guarded by Server.mu (the driver is part
// of the coordinator's core); the rest is set once.
type fedJob struct {
	s        *Server
	e        *jobEntry
	jobID    string
	gen      uint64
	spec     *pb.JobSpec
	n        int // clients: one per worker
	params   int // model parameters
	classes  int
	rounds   int
	every    int // evaluate every this many closed rounds
	deadline time.Duration
	net      *models.Network     // the model's layout, and the buffers its checkpoints hold
	strat    *federated.Strategy // the server optimiser, whose state checkpoints hold
	ckpt     *fedCheckpointer    // nil: the job writes no checkpoints
	// firstDone is the number of rounds closed before this run (those of
	// the checkpoint it resumed from); resumedDone says they are all of
	// them, so only the final evaluation is left.
	firstDone   int
	resumedDone bool

	wake      chan struct{} // (capacity 1) the clock's wake-up time changed
	done      chan struct{} // closed by abort
	abortOnce sync.Once

	// Guarded by Server.mu:
	srv       *federated.Server
	started   bool
	startBy   time.Time       // the first round opens then at the latest
	sessions  []*fedSession   // by client; nil while not connected
	hists     [][]int         // by client: its label histogram (from its join)
	weights   [][]float32     // by client: class-balanced loss weights; nil without reweighting
	open      *fedRound       // the open round, nil when none
	closed    int             // rounds closed, those before a resume included
	lastRound int             // the number of the last round that closed
	evals     []*fedEval      // closed rounds waiting for their evaluation, oldest first
	evaluator *fedSession     // who evaluates; nil: pick one when needed
	finished  bool            // the last round closed: the job ends with its evaluation
	evalBy    time.Time       // when finished: the final evaluation is due by then
	wakeAt    time.Time       // when the clock must call tickLocked; zero: never
	last      *pb.TaskEval    // the latest evaluation recorded
	lastTrain float64         // the last closed round's training loss
	lost      map[string]bool // workers lost
}

// fedRound is an open round as clients are told of it.
type fedRound struct {
	round    int
	sampled  []int
	deadline time.Time
	model    []float32 // the global parameters the round starts from; read only
}

// fedEval is a closed round waiting for the evaluator.
type fedEval struct {
	info   *pb.RoundInfo
	train  float64   // the round's training loss
	model  []float32 // the global parameters after it; read only
	sentTo *fedSession
}

// fedSession is one client's Participate stream.
type fedSession struct {
	client int
	out    chan fedMsg // to the stream's sender; never closed
	stop   context.CancelFunc
}

// fedMsg is one message for a client, followed by a model when model is
// set (frames tagged with tag's op, step and phase).
type fedMsg struct {
	resp  *pb.ParticipateResponse
	model []float32
	tag   *pb.TensorFrame
}

// sendLocked queues m for the client, dropping the session when its
// outbox is full (it then misses its rounds).
func (c *fedSession) sendLocked(m fedMsg) {
	select {
	case c.out <- m:
	default:
		c.stop()
	}
}

// fedCheckpointer writes a real-client fedavg job's checkpoints into dir.
type fedCheckpointer struct {
	dir  string
	keep int
	meta checkpoint.Meta // the job's: id, spec hash, world size, seed
	// Guarded by Server.mu:
	lastSave time.Time // for every_seconds
	saved    int       // rounds closed at the newest checkpoint on disk (or resumed from)
}

// newFedJob builds the round driver of e's generation from net's initial
// parameters, or, when the job resumes, from its checkpoint's (net is
// loaded with them), and starts its clock (a goroutine owned by the
// Server: it ends when the job is aborted, and Serve waits for it).
// ckptDir "" means no checkpoints.
func (s *Server) newFedJob(e *jobEntry, net *models.Network, ckptDir string) (*fedJob, error) {
	j := e.job
	spec := j.Spec
	f := spec.GetFederated()
	weighting, err := federated.ParseWeighting(f.GetWeighting())
	if err != nil {
		return nil, err
	}
	strat, err := federated.NewStrategy(federated.StrategyConfig{Name: f.GetStrategy(), Weighting: weighting,
		ServerLR: f.GetServerLr(), ServerMomentum: f.GetServerMomentum()})
	if err != nil {
		return nil, err
	}
	n := len(j.WorkerIds)
	rounds := int(f.GetRounds())
	var snap *federated.Snapshot
	if j.ResumeFrom != "" {
		if snap, err = federated.LoadCheckpoint(j.ResumeFrom, jobspec.CheckpointHash(spec)); err != nil {
			return nil, fmt.Errorf("resuming from checkpoint: %w", err)
		}
		if snap.Completed > rounds {
			return nil, fmt.Errorf("resuming from checkpoint %s: %d rounds closed, the job has %d", j.ResumeFrom, snap.Completed, rounds)
		}
		if err := snap.Restore(net, strat); err != nil {
			return nil, fmt.Errorf("resuming from checkpoint %s: %w", j.ResumeFrom, err)
		}
	}
	deadline := time.Duration(f.GetRoundDeadlineSeconds() * float64(time.Second))
	srv, err := federated.NewServer(federated.ServerConfig{Clients: n, Fraction: f.GetFraction(), Rounds: rounds,
		MinClients: int(f.GetMinClients()), Deadline: deadline, Seed: spec.GetSeed()}, strat, slices.Clone(net.Params()))
	if err != nil {
		return nil, err
	}
	firstDone, lastRound := 0, 0
	if snap != nil {
		firstDone, lastRound = snap.Completed, snap.Round
		if snap.Completed < rounds {
			if err := srv.Resume(snap.Round, snap.Completed); err != nil {
				return nil, fmt.Errorf("resuming from checkpoint %s: %w", j.ResumeFrom, err)
			}
		}
	}
	_, _, _, classes := jobspec.InputShape(spec)
	fj := &fedJob{
		s: s, e: e, jobID: j.Id, gen: j.Generation, spec: spec, n: n, params: net.NumParams(), classes: classes,
		rounds: rounds, every: max(int(f.GetEvalEveryRounds()), 1), deadline: deadline,
		net: net, strat: strat, firstDone: firstDone, resumedDone: firstDone == rounds,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
		srv: srv, startBy: s.cfg.Now().Add(deadline), sessions: make([]*fedSession, n),
		hists: make([][]int, n), weights: make([][]float32, n), lost: map[string]bool{},
		closed: firstDone, lastRound: lastRound,
	}
	if ckptDir != "" {
		fj.ckpt = &fedCheckpointer{dir: ckptDir, keep: int(spec.GetCheckpoint().GetKeep()),
			meta:     checkpoint.Meta{JobID: j.Id, SpecHash: jobspec.CheckpointHash(spec), WorldSize: n, Seed: spec.GetSeed()},
			lastSave: s.cfg.Now(), saved: firstDone}
	}
	fj.wakeAt = fj.startBy
	s.streams.Add(1)
	go func() { // owned by the Server: ends when the job is aborted
		defer s.streams.Done()
		fj.clock()
	}()
	return fj, nil
}

// abort stops the driver: the clock returns and every client's stream
// ends. Safe to call more than once, with or without Server.mu.
func (fj *fedJob) abort(error) {
	fj.abortOnce.Do(func() { close(fj.done) })
}

// kickLocked tells the clock that wakeAt changed.
func (fj *fedJob) kickLocked() {
	select {
	case fj.wake <- struct{}{}:
	default:
	}
}

// clock calls tickLocked at wakeAt, rearming whenever it changes.
func (fj *fedJob) clock() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	arm := func() {
		fj.s.mu.Lock()
		at := fj.wakeAt
		now := fj.s.cfg.Now()
		fj.s.mu.Unlock()
		t.Stop()
		if !at.IsZero() {
			t.Reset(max(at.Sub(now), 0))
		}
	}
	arm()
	for {
		select {
		case <-fj.done:
			return
		case <-fj.wake:
			arm()
		case <-t.C:
			fj.s.mu.Lock()
			fj.tickLocked()
			fj.s.mu.Unlock()
			arm()
		}
	}
}

// activeLocked reports whether the job still runs this driver.
func (fj *fedJob) activeLocked() bool {
	select {
	case <-fj.done:
		return false
	default:
	}
	return fj.e.fed == fj && !fj.e.final()
}

// tickLocked handles the time: the start's, a round's and the final
// evaluation's deadlines.
func (fj *fedJob) tickLocked() {
	if !fj.activeLocked() {
		return
	}
	now := fj.s.cfg.Now()
	switch {
	case !fj.started && !now.Before(fj.startBy):
		fj.startLocked(now)
	case fj.finished && !now.Before(fj.evalBy):
		fj.failLocked(fmt.Sprintf("no client evaluated the final global model within %v of the last round", fj.deadline))
	case fj.open != nil:
		acts, err := fj.srv.Tick(now)
		fj.applyLocked(acts, err)
	}
	fj.rearmLocked()
}

// rearmLocked sets the clock's next wake-up from the driver's state.
func (fj *fedJob) rearmLocked() {
	at := time.Time{}
	switch {
	case !fj.started:
		at = fj.startBy
	case fj.finished:
		at = fj.evalBy
	case fj.open != nil:
		at = fj.open.deadline
	}
	if !at.Equal(fj.wakeAt) {
		fj.wakeAt = at
		fj.kickLocked()
	}
}

func (fj *fedJob) startLocked(now time.Time) {
	fj.started = true
	var joined []int
	for k, c := range fj.sessions {
		if c != nil {
			joined = append(joined, k)
		}
	}
	fj.s.log.Info("federated rounds start", "job", fj.jobID, "clients", fj.n, "joined", joined, "rounds_done", fj.firstDone)
	if fj.resumedDone {
		// The checkpoint is of the last round: only its evaluation is left.
		fj.finished = true
		fj.evalBy = now.Add(fj.deadline)
		fj.evals = append(fj.evals, &fedEval{info: &pb.RoundInfo{Round: int32(fj.lastRound)}, model: slices.Clone(fj.srv.Global())})
		fj.sendEvalsLocked()
		fj.rearmLocked()
		return
	}
	acts, err := fj.srv.Start(now)
	fj.applyLocked(acts, err)
}

// applyLocked carries out the Server's actions; err is the job's failure
// (the actions then end with a *RoundFailed), or nil.
func (fj *fedJob) applyLocked(acts []federated.Action, err error) {
	for _, a := range acts {
		if !fj.activeLocked() {
			return // a checkpoint that could not be written ended the job
		}
		switch a := a.(type) {
		case *federated.OpenRound:
			fj.open = &fedRound{round: a.Round, sampled: a.Clients, deadline: a.Deadline, model: slices.Clone(a.Global)}
			for _, c := range fj.sessions {
				if c != nil {
					fj.sendRoundLocked(c)
				}
			}
		case *federated.RoundClosed:
			fj.open = nil
			fj.closedLocked(a)
		case *federated.RoundFailed:
			fj.open = nil
			msg := fmt.Sprintf("round %d failed: %v", a.Round, a.Err)
			if a.Retry {
				msg += "; the next round starts from the same global model"
			}
			fj.s.emitLocked(fj.e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
			fj.logLocked(map[string]any{"kind": "round_failed", "round": a.Round, "error": a.Err.Error(), "retry": a.Retry})
		case *federated.Finished:
			fj.finished = true
			fj.evalBy = fj.s.cfg.Now().Add(fj.deadline)
		}
	}
	if err != nil {
		fj.failLocked(err.Error())
		return
	}
	if fj.dropLostLocked() {
		return // it applied the actions of the round closing early
	}
	fj.rearmLocked()
}

// dropLostLocked tells the round state machine which of the open round's
// sampled clients are lost, so that the round closes once the others have
// answered instead of waiting for the lost ones until its deadline. It
// reports whether that produced actions (then applied, with the timer
// rearmed by that apply).
func (fj *fedJob) dropLostLocked() bool {
	if fj.open == nil || !fj.activeLocked() {
		return false
	}
	ids := fj.e.job.WorkerIds
	for _, c := range fj.open.sampled {
		if c >= len(ids) || !fj.lost[ids[c]] {
			continue
		}
		if acts, err := fj.srv.Drop(fj.s.cfg.Now(), c); len(acts) > 0 || err != nil {
			fj.applyLocked(acts, err)
			return true
		}
	}
	return false
}

// sendRoundLocked tells client c of the open round: its settings and, if
// it is sampled, the global model.
func (fj *fedJob) sendRoundLocked(c *fedSession) {
	r := fj.open
	f := fj.spec.GetFederated()
	_, sampled := slices.BinarySearch(r.sampled, c.client)
	rs := &pb.RoundStart{Round: int32(r.round), Sampled: sampled,
		DeadlineSeconds: max(r.deadline.Sub(fj.s.cfg.Now()).Seconds(), 0),
		LocalEpochs:     f.GetLocalEpochs(), LocalBatchSize: f.GetLocalBatchSize(), ClientLr: f.GetClientLr(), Mu: f.GetMu(),
		ClassWeights: fj.weights[c.client]}
	m := fedMsg{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Round{Round: rs}}}
	if sampled {
		m.model = r.model
		m.tag = &pb.TensorFrame{JobId: fj.jobID, Generation: fj.gen, Op: pb.Op_OP_BROADCAST, Step: int64(r.round), Phase: 0}
	}
	c.sendLocked(m)
}

// closedLocked records a closed round: progress, and an evaluation to ask
// for when one is due.
func (fj *fedJob) closedLocked(a *federated.RoundClosed) {
	fj.closed++
	fj.lastRound = a.Round
	fj.lastTrain = a.Stats.TrainLoss
	now := fj.s.cfg.Now()
	e := fj.e
	elapsed := now.Sub(e.started).Seconds()
	p := &pb.Progress{Epoch: int32(a.Round), Step: int64(a.Round), TotalSteps: int64(fj.rounds), Loss: a.Stats.TrainLoss,
		LearningRate: fj.spec.GetFederated().GetClientLr(), ElapsedSeconds: elapsed,
		EtaSeconds: elapsed / float64(fj.closed-fj.firstDone) * float64(fj.rounds-fj.closed)}
	e.job.Progress = p
	fj.logLocked(map[string]any{"kind": "progress", "rank": 0, "epoch": p.Epoch, "step": p.Step, "total_steps": p.TotalSteps,
		"loss": p.Loss, "learning_rate": p.LearningRate, "elapsed_seconds": p.ElapsedSeconds,
		"participants": a.Participants, "missing": a.Missing, "at_deadline": a.AtDeadline})
	fj.s.emitLocked(e, pb.EventKind_EVENT_KIND_PROGRESS, "", nil)
	if c := fj.ckpt; c != nil && jobspec.CheckpointDue(fj.spec, int64(fj.closed), true, fj.closed-1, now.Sub(c.lastSave)) {
		switch path, err := fj.saveLocked(now); {
		case err != nil && path == "":
			// As in the simulation: a checkpoint the spec asks for that
			// cannot be written fails the job.
			fj.failLocked(fmt.Sprintf("round %d: writing a checkpoint: %v", a.Round, err))
			return
		case err != nil:
			fj.s.log.Warn("checkpoint written, but removing older ones failed", "job", fj.jobID, "err", err)
		default:
			fj.s.log.Debug("checkpoint written", "job", fj.jobID, "path", path)
		}
	}
	if fj.closed != fj.rounds && fj.closed%fj.every != 0 {
		return
	}
	info := &pb.RoundInfo{Round: int32(a.Round), UpdateNorm: a.Stats.DeltaNorm}
	for _, k := range a.Participants {
		info.Participants = append(info.Participants, int32(k))
		lh := &pb.LabelHistogram{}
		for _, v := range fj.hists[k] {
			lh.Counts = append(lh.Counts, int32(v))
		}
		info.LabelHistograms = append(info.LabelHistograms, lh)
	}
	for _, k := range a.Missing {
		info.Missing = append(info.Missing, int32(k))
	}
	fj.evals = append(fj.evals, &fedEval{info: info, train: a.Stats.TrainLoss, model: slices.Clone(a.Global)})
	fj.sendEvalsLocked()
}

// sendEvalsLocked sends the evaluations not yet sent to the evaluator.
func (fj *fedJob) sendEvalsLocked() {
	if fj.evaluator == nil {
		for _, c := range fj.sessions {
			if c != nil {
				fj.evaluator = c
				break
			}
		}
	}
	c := fj.evaluator
	if c == nil {
		return // nobody to ask: the next client to join
	}
	for _, ev := range fj.evals {
		if ev.sentTo == c {
			continue
		}
		ev.sentTo = c
		c.sendLocked(fedMsg{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Eval{Eval: &pb.EvalRequest{Round: ev.info.Round}}},
			model: ev.model, tag: &pb.TensorFrame{JobId: fj.jobID, Generation: fj.gen, Op: pb.Op_OP_BROADCAST, Step: int64(ev.info.Round), Phase: 1}})
	}
}

// evalLocked records the evaluator's result for the oldest pending round
// and ends the job after the last one.
func (fj *fedJob) evalLocked(c *fedSession, r *pb.ClientEval) error {
	if len(fj.evals) == 0 || fj.evals[0].sentTo != c || fj.evals[0].info.Round != r.Round {
		return status.Errorf(codes.InvalidArgument, "client %d: evaluation of round %d was not asked for", c.client, r.Round)
	}
	acc, loss := r.TestAccuracy, r.TestLoss
	if !(acc >= 0 && acc <= 1) || loss != loss || loss < 0 {
		return status.Errorf(codes.InvalidArgument, "client %d: evaluation of round %d: accuracy %v must be in [0, 1] and loss %v ≥ 0", c.client, r.Round, acc, loss)
	}
	ev := fj.evals[0]
	fj.evals = fj.evals[1:]
	te := &pb.TaskEval{JobId: fj.jobID, Rank: int32(c.client), Generation: fj.gen, Epoch: ev.info.Round, Step: int64(ev.info.Round),
		TestAccuracy: acc, TestLoss: loss, TrainLoss: ev.train, Round: ev.info}
	fj.last = te
	fj.s.recordEvalLocked(fj.e, te, fj.s.cfg.Now())
	if fj.finished && len(fj.evals) == 0 {
		fj.succeedLocked()
	}
	return nil
}

// succeedLocked ends the job after its final evaluation.
func (fj *fedJob) succeedLocked() {
	cnt := fj.srv.Counters()
	msg := fmt.Sprintf("test accuracy %.2f%% after %d round(s)", 100*fj.last.TestAccuracy, fj.rounds)
	if cnt.Stale > 0 || cnt.FailedRounds > 0 {
		msg += fmt.Sprintf("; %d stale update(s) refused (%d late), %d round(s) failed", cnt.Stale, cnt.Late, cnt.FailedRounds)
	}
	fj.logLocked(map[string]any{"kind": "federation", "rounds": fj.rounds, "stale_updates": cnt.Stale, "late_updates": cnt.Late,
		"rejected_updates": cnt.Rejected, "failed_rounds": cnt.FailedRounds, "lost_workers": len(fj.lost)})
	fj.e.job.Result = &pb.JobResult{TestAccuracy: fj.last.TestAccuracy, TestLoss: fj.last.TestLoss, TrainLoss: fj.lastTrain,
		Epochs: int32(fj.rounds), Steps: int64(fj.closed), ParameterChecksum: models.Checksum(fj.srv.Global())}
	for _, c := range fj.sessions {
		if c != nil {
			c.sendLocked(fedMsg{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Done{Done: &pb.FederationDone{Message: msg}}}})
		}
	}
	fj.s.endJobLocked(fj.e, pb.JobState_JOB_STATE_SUCCEEDED, msg)
}

// saveLocked writes a checkpoint of the state after the last closed
// round, unless the newest on disk already is of it ("", nil).
func (fj *fedJob) saveLocked(now time.Time) (string, error) {
	c := fj.ckpt
	if fj.closed <= c.saved {
		return "", nil
	}
	snap := federated.NewSnapshot(fj.lastRound, fj.closed, fj.net, fj.srv.Global(), fj.net.Buffers(), fj.strat)
	meta := c.meta
	meta.Created = now
	path, err := federated.SaveCheckpoint(c.dir, snap, meta, c.keep)
	if path != "" { // written, even if removing older ones failed
		c.saved, c.lastSave = fj.closed, now
	}
	return path, err
}

// saveStoppedLocked writes the checkpoint of a job that stops early (after
// abort): the state after its last closed round, so that a resume loses
// nothing. It writes nothing ("", nil) for a job without checkpoints or
// that closed no round since it started.
func (fj *fedJob) saveStoppedLocked(now time.Time) (string, error) {
	if fj.ckpt == nil {
		return "", nil
	}
	return fj.saveLocked(now)
}

func (fj *fedJob) failLocked(msg string) {
	fj.s.endJobLocked(fj.e, pb.JobState_JOB_STATE_FAILED, msg)
}

func (fj *fedJob) logLocked(rec map[string]any) {
	if fj.e.run != nil {
		rec["time"] = fj.s.cfg.Now().UTC().Format(time.RFC3339Nano)
		_ = fj.e.run.Log(rec)
	}
}

// workerLostLocked: a lost worker's client misses the rounds it is
// sampled for; the job fails only when every client is lost.
func (fj *fedJob) workerLostLocked(w *workerEntry, reason string) {
	client := slices.Index(fj.e.job.WorkerIds, w.info.Id)
	fj.lost[w.info.Id] = true
	if len(fj.lost) == fj.n {
		fj.failLocked(fmt.Sprintf("every client is lost; the last, worker %s (client %d): %s", w.info.Id, client, reason))
		return
	}
	msg := fmt.Sprintf("worker %s (client %d) lost: %s; it is missing from the rounds it is sampled for", w.info.Id, client, reason)
	fj.s.emitLocked(fj.e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
	fj.logLocked(map[string]any{"kind": "client_lost", "client": client, "worker": w.info.Id, "reason": reason})
	if !fj.started && fj.allInLocked() {
		fj.startLocked(fj.s.cfg.Now()) // the others are in: no need to wait for it
		return
	}
	fj.dropLostLocked() // the open round need not wait for it
}

// joinLocked registers a client's stream and catches it up: the open
// round if it is sampled and has not answered, and the evaluations if it
// becomes the evaluator. The first round opens when every client is in.
func (fj *fedJob) joinLocked(c *fedSession, hist []int) error {
	if fj.sessions[c.client] != nil {
		return status.Errorf(codes.AlreadyExists, "client %d of job %s is already connected", c.client, fj.jobID)
	}
	f := fj.spec.GetFederated()
	if f.GetReweighting() == "class-balanced" && fj.weights[c.client] == nil {
		w, err := federated.ClassBalancedWeights(hist, f.GetBeta())
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "client %d: %v", c.client, err)
		}
		fj.weights[c.client] = make([]float32, len(w))
		for i, v := range w {
			fj.weights[c.client][i] = float32(v)
		}
	}
	fj.sessions[c.client] = c
	fj.hists[c.client] = hist
	c.sendLocked(fedMsg{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Joined{Joined: &pb.Joined{Rounds: int32(fj.rounds)}}}})
	if fj.open != nil {
		fj.sendRoundLocked(c)
	}
	fj.sendEvalsLocked()
	if !fj.started && fj.allInLocked() {
		fj.startLocked(fj.s.cfg.Now())
	}
	return nil
}

// allInLocked reports whether every client has joined or is lost: the
// first round need not wait any longer.
func (fj *fedJob) allInLocked() bool {
	ids := fj.e.job.WorkerIds
	for k, c := range fj.sessions {
		if c == nil && (k >= len(ids) || !fj.lost[ids[k]]) {
			return false
		}
	}
	return true
}

// leaveLocked forgets a client's stream; its pending evaluations go to
// the next evaluator.
func (fj *fedJob) leaveLocked(c *fedSession) {
	if fj.sessions[c.client] != c {
		return
	}
	fj.sessions[c.client] = nil
	if fj.evaluator == c {
		fj.evaluator = nil
		if fj.activeLocked() {
			fj.sendEvalsLocked()
		}
	}
}

// fedRecv is what a client's receiving goroutine assembles: an update's
// header and its delta so far.
type fedRecv struct {
	hdr   *pb.ClientUpdate
	delta []float32
	next  int
}

// updateLocked offers a complete update to the Server and maps its
// refusals to gRPC codes.
func (fj *fedJob) updateLocked(c *fedSession, u federated.Update) error {
	if !fj.activeLocked() {
		return status.Errorf(codes.FailedPrecondition, "job %s has ended", fj.jobID)
	}
	if !fj.started {
		return status.Errorf(codes.FailedPrecondition, "client %d: update for round %d before the first round opened", c.client, u.Round)
	}
	acts, err := fj.srv.Submit(fj.s.cfg.Now(), u)
	var stale *federated.StaleRoundError
	var unknown *federated.UnknownClientError
	var invalid *federated.InvalidUpdateError
	refusal := errors.As(err, &stale) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.Is(err, federated.ErrDuplicate) || errors.Is(err, federated.ErrNotRunning)
	if refusal {
		fj.applyLocked(acts, nil)
	} else {
		fj.applyLocked(acts, err)
	}
	switch {
	case err == nil:
		c.sendLocked(fedMsg{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Accepted{Accepted: &pb.UpdateAccepted{Round: int32(u.Round)}}}})
		return nil
	case stale != nil:
		fj.logLocked(map[string]any{"kind": "stale_update", "client": c.client, "round": u.Round, "late": stale.Late, "current_round": stale.Current})
		fj.s.log.Info("stale federated update refused", "job", fj.jobID, "client", c.client, "round", u.Round, "late", stale.Late)
		return status.Error(codes.Aborted, err.Error())
	case unknown != nil || invalid != nil:
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, federated.ErrDuplicate):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, federated.ErrNotRunning):
		return status.Errorf(codes.FailedPrecondition, "job %s: %v", fj.jobID, err)
	}
	return status.Errorf(codes.Aborted, "job %s failed: %v", fj.jobID, err)
}

// Participate serves one real federated client's stream (see
// federation.proto).
func (s *Server) Participate(stream pb.Federation_ParticipateServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	join := m.GetJoin()
	if join == nil {
		return status.Error(codes.InvalidArgument, "the first message on Participate must be a join")
	}
	if len(join.JobId) == 0 || len(join.JobId) > 128 {
		return status.Error(codes.InvalidArgument, "join.job_id must be 1..128 bytes")
	}
	s.mu.Lock()
	e := s.jobs[join.JobId]
	var fj *fedJob
	if e != nil && e.job.State == pb.JobState_JOB_STATE_RUNNING {
		fj = e.fed
	}
	s.mu.Unlock()
	switch {
	case e == nil:
		return status.Errorf(codes.NotFound, "job %q not found", join.JobId)
	case fj == nil:
		return status.Errorf(codes.FailedPrecondition, "job %s is not a running fedavg job with real clients", join.JobId)
	case join.Generation != fj.gen:
		return status.Errorf(codes.Aborted, "generation %d is stale; the job is at generation %d", join.Generation, fj.gen)
	case join.NumClients != int32(fj.n):
		return status.Errorf(codes.InvalidArgument, "num_clients %d, the job has %d", join.NumClients, fj.n)
	case join.Client < 0 || int(join.Client) >= fj.n:
		return status.Errorf(codes.InvalidArgument, "client %d out of range [0, %d)", join.Client, fj.n)
	case join.NumParams != int64(fj.params):
		return status.Errorf(codes.InvalidArgument, "model has %d parameters, the server's has %d", join.NumParams, fj.params)
	}
	hist, err := checkHistogram(join.LabelHistogram, join.NumExamples, fj.classes)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "join of client %d: %v", join.Client, err)
	}
	c := &fedSession{client: int(join.Client), out: make(chan fedMsg, fedOutbox), stop: cancel}
	s.mu.Lock()
	if !fj.activeLocked() {
		s.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "job %s has ended", fj.jobID)
	}
	err = fj.joinLocked(c, hist)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		s.mu.Lock()
		fj.leaveLocked(c)
		s.mu.Unlock()
	}()

	// The receive loop runs beside the handler (as Connect's), so that the
	// handler can end the stream while Recv blocks; Serve waits for it.
	recvErr := make(chan error, 1)
	s.streams.Add(1)
	go func() {
		defer s.streams.Done()
		err := fj.receive(c, stream)
		recvErr <- err
		cancel()
	}()
	var sp wire.Splitter
	for {
		select {
		case m := <-c.out:
			if err := fj.send(stream, &sp, m); err != nil {
				return err
			}
			if m.resp.GetDone() != nil {
				return nil
			}
		case <-fj.done:
			// A job that succeeded queued FederationDone before it ended:
			// deliver it; any other message is moot now.
			for {
				select {
				case m := <-c.out:
					if m.resp.GetDone() != nil {
						return stream.Send(m.resp)
					}
				default:
					return status.Errorf(codes.FailedPrecondition, "job %s has ended", fj.jobID)
				}
			}
		case <-ctx.Done():
			select {
			case err := <-recvErr:
				if errors.Is(err, io.EOF) {
					return nil // the client left
				}
				return err
			default:
			}
			if err := stream.Context().Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Errorf(codes.ResourceExhausted, "client %d is not reading its stream: dropped", c.client)
		}
	}
}

// send writes one message and the model that follows it.
func (fj *fedJob) send(stream pb.Federation_ParticipateServer, sp *wire.Splitter, m fedMsg) error {
	if err := stream.Send(m.resp); err != nil {
		return err
	}
	if m.model == nil {
		return nil
	}
	return sp.Frames(m.tag, m.model, func(f *pb.TensorFrame) error {
		return stream.Send(&pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Model{Model: f}})
	})
}

// receive reads a client's messages until the stream ends or a message is
// refused (the error, with its code, ends the stream).
func (fj *fedJob) receive(c *fedSession, stream pb.Federation_ParticipateServer) error {
	s := fj.s
	var r fedRecv
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch m := m.Msg.(type) {
		case *pb.ParticipateRequest_Update:
			if r.hdr != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: a new update header before the delta of round %d ended", c.client, r.hdr.Round)
			}
			if m.Update.Round < 1 {
				return status.Errorf(codes.InvalidArgument, "client %d: update for round %d; rounds are numbered from 1", c.client, m.Update.Round)
			}
			r = fedRecv{hdr: m.Update, delta: make([]float32, fj.params)}
		case *pb.ParticipateRequest_Delta:
			if r.hdr == nil {
				return status.Errorf(codes.InvalidArgument, "client %d: delta frame without an update header", c.client)
			}
			f := m.Delta
			off, n, err := wire.Check(f, wire.Expect{JobID: fj.jobID, Generation: fj.gen, Op: pb.Op_OP_PUSH_GRADIENT,
				Step: int64(r.hdr.Round), Total: uint64(fj.params)})
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: %v", c.client, err)
			}
			if off != r.next {
				return status.Errorf(codes.InvalidArgument, "client %d: delta frame at offset %d, want %d (frames in order)", c.client, off, r.next)
			}
			if err := wire.GetF32(r.delta[off:off+n], f.Data); err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: %v", c.client, err)
			}
			r.next += n
			if !f.Last {
				continue
			}
			if r.next != fj.params {
				return status.Errorf(codes.InvalidArgument, "client %d: last delta frame ends at %d of %d values", c.client, r.next, fj.params)
			}
			hdr := r.hdr
			hist, err := checkHistogram(hdr.LabelHistogram, hdr.NumExamples, fj.classes)
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: update for round %d: %v", c.client, hdr.Round, err)
			}
			u := federated.Update{Client: c.client, Round: int(hdr.Round), Delta: r.delta, NumExamples: int(hdr.NumExamples),
				LabelHist: hist, TrainLoss: hdr.TrainLoss}
			r = fedRecv{}
			s.mu.Lock()
			err = fj.updateLocked(c, u)
			s.mu.Unlock()
			if err != nil {
				return err
			}
		case *pb.ParticipateRequest_Eval:
			s.mu.Lock()
			err := error(status.Errorf(codes.FailedPrecondition, "job %s has ended", fj.jobID))
			if fj.activeLocked() {
				err = fj.evalLocked(c, m.Eval)
			}
			s.mu.Unlock()
			if err != nil {
				return err
			}
		default:
			return status.Errorf(codes.InvalidArgument, "client %d: unexpected message %T after the join", c.client, m)
		}
	}
}

// checkHistogram converts a label histogram from the network: classes
// counts (or none), each ≥ 0, summing to n.
func checkHistogram(h []int64, n int64, classes int) ([]int, error) {
	if n < 0 || n > 1<<31 {
		return nil, fmt.Errorf("num_examples %d out of range [0, 2^31]", n)
	}
	if len(h) == 0 {
		return nil, nil
	}
	if len(h) != classes || classes > maxLabelClasses {
		return nil, fmt.Errorf("label histogram has %d classes, the model %d", len(h), classes)
	}
	out := make([]int, len(h))
	var sum int64
	for i, v := range h {
		if v < 0 || v > n {
			return nil, fmt.Errorf("label histogram count %d for class %d out of range [0, %d]", v, i, n)
		}
		out[i] = int(v)
		sum += v
	}
	if sum != n {
		return nil, fmt.Errorf("label histogram sums to %d, num_examples is %d", sum, n)
	}
	return out, nil
}
