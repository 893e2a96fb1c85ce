package federation

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// tick handles the time: the start's, a round's and the final
// evaluation's deadlines.
func (d *Driver) tick() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.activeLocked() {
		return
	}
	now := d.now()
	switch {
	case !d.begun && !now.Before(d.startBy):
		d.startLocked(now)
	case d.finished && !now.Before(d.evalBy):
		d.failLocked(fmt.Sprintf("no client evaluated the final global model within %v of the last round", d.deadline))
	case d.open != nil:
		acts, err := d.srv.Tick(now)
		d.applyLocked(acts, err)
	}
	d.rearmLocked()
}

// rearmLocked sets Run's next wake-up from the driver's state.
func (d *Driver) rearmLocked() {
	at := time.Time{}
	switch {
	case !d.begun:
		at = d.startBy
	case d.finished:
		at = d.evalBy
	case d.open != nil:
		at = d.open.deadline
	}
	if !at.Equal(d.wakeAt) {
		d.wakeAt = at
		d.kickLocked()
	}
}

func (d *Driver) startLocked(now time.Time) {
	d.begun = true
	var joined []int
	for k, c := range d.sessions {
		if c != nil {
			joined = append(joined, k)
		}
	}
	d.log.Info("federated rounds start", "job", d.jobID, "clients", d.n, "joined", joined, "rounds_done", d.firstDone)
	if d.resumedDone {
		// The checkpoint is of the last round: only its evaluation is left.
		d.finished = true
		d.evalBy = now.Add(d.deadline)
		d.evals = append(d.evals, &pendingEval{info: &pb.RoundInfo{Round: int32(d.lastRound)}, model: slices.Clone(d.srv.Global())})
		d.sendEvalsLocked()
		d.rearmLocked()
		return
	}
	if d.entry && !d.entryServerLocked() {
		return
	}
	acts, err := d.srv.Start(now)
	d.applyLocked(acts, err)
}

// applyLocked carries out the Server's actions; err is the job's failure
// (the actions then end with a *RoundFailed), or nil.
func (d *Driver) applyLocked(acts []federated.Action, err error) {
	for _, a := range acts {
		if !d.activeLocked() {
			return // a checkpoint that could not be written ended the job
		}
		switch a := a.(type) {
		case *federated.OpenRound:
			d.open = &openRound{round: a.Round, sampled: a.Clients, deadline: a.Deadline, model: slices.Clone(a.Global)}
			for _, c := range d.sessions {
				if c != nil {
					d.sendRoundLocked(c)
				}
			}
		case *federated.RoundClosed:
			d.open = nil
			d.closedLocked(a)
		case *federated.RoundFailed:
			d.open = nil
			msg := fmt.Sprintf("round %d failed: %v", a.Round, a.Err)
			if a.Retry {
				msg += "; the next round starts from the same global model"
			}
			d.emitLocked(Event{Kind: pb.EventKind_EVENT_KIND_LOG, Message: msg})
			d.logLocked(map[string]any{"kind": "round_failed", "round": a.Round, "error": a.Err.Error(), "retry": a.Retry})
		case *federated.Finished:
			d.finished = true
			d.evalBy = d.now().Add(d.deadline)
		}
	}
	if err != nil {
		d.failLocked(err.Error())
		return
	}
	if d.dropLostLocked() {
		return // it applied the actions of the round closing early
	}
	d.rearmLocked()
}

// dropLostLocked tells the round state machine which of the open round's
// sampled clients are lost, so that the round closes once the others have
// answered instead of waiting for the lost ones until its deadline. It
// reports whether that produced actions (then applied, with the timer
// rearmed by that apply).
func (d *Driver) dropLostLocked() bool {
	if d.open == nil || !d.activeLocked() {
		return false
	}
	for _, c := range d.open.sampled {
		if c >= d.n || !d.lost[c] {
			continue
		}
		if acts, err := d.srv.Drop(d.now(), c); len(acts) > 0 || err != nil {
			d.applyLocked(acts, err)
			return true
		}
	}
	return false
}

// sendRoundLocked tells client c of the open round: its settings and, if
// it is sampled, the global model.
func (d *Driver) sendRoundLocked(c *session) {
	r := d.open
	f := d.spec.GetFederated()
	_, sampled := slices.BinarySearch(r.sampled, c.client)
	rs := &pb.RoundStart{Round: int32(r.round), Sampled: sampled,
		DeadlineSeconds: max(r.deadline.Sub(d.now()).Seconds(), 0),
		LocalEpochs:     f.GetLocalEpochs(), LocalBatchSize: f.GetLocalBatchSize(), ClientLr: f.GetClientLr(), Mu: f.GetMu(),
		ClassWeights: d.weights[c.client]}
	m := message{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Round{Round: rs}}}
	if sampled {
		m.model = r.model
		m.tag = &pb.TensorFrame{JobId: d.jobID, Generation: d.gen, Op: pb.Op_OP_BROADCAST, Step: int64(r.round), Phase: 0}
	}
	c.sendLocked(m)
}

// closedLocked records a closed round: progress, a checkpoint when one is
// due, and an evaluation to ask for when one is due.
func (d *Driver) closedLocked(a *federated.RoundClosed) {
	d.closed++
	d.lastRound = a.Round
	d.lastTrain = a.Stats.TrainLoss
	now := d.now()
	elapsed := now.Sub(d.started).Seconds()
	p := &pb.Progress{Epoch: int32(a.Round), Step: int64(a.Round), TotalSteps: int64(d.rounds), Loss: a.Stats.TrainLoss,
		LearningRate: d.spec.GetFederated().GetClientLr(), ElapsedSeconds: elapsed,
		EtaSeconds: elapsed / float64(d.closed-d.firstDone) * float64(d.rounds-d.closed)}
	d.logLocked(map[string]any{"kind": "progress", "rank": 0, "epoch": p.Epoch, "step": p.Step, "total_steps": p.TotalSteps,
		"loss": p.Loss, "learning_rate": p.LearningRate, "elapsed_seconds": p.ElapsedSeconds,
		"participants": a.Participants, "missing": a.Missing, "at_deadline": a.AtDeadline})
	d.emitLocked(Event{Kind: pb.EventKind_EVENT_KIND_PROGRESS, Progress: p})
	if c := d.ckpt; c != nil && jobspec.CheckpointDue(d.spec, int64(d.closed), true, d.closed-1, now.Sub(c.lastSave)) {
		switch path, err := d.saveLocked(now); {
		case err != nil && path == "":
			// As in the simulation: a checkpoint the spec asks for that
			// cannot be written fails the job.
			d.failLocked(fmt.Sprintf("round %d: writing a checkpoint: %v", a.Round, err))
			return
		case err != nil:
			d.log.Warn("checkpoint written, but removing older ones failed", "job", d.jobID, "err", err)
		default:
			d.log.Debug("checkpoint written", "job", d.jobID, "path", path)
		}
	}
	if d.closed != d.rounds && d.closed%d.every != 0 {
		return
	}
	info := &pb.RoundInfo{Round: int32(a.Round), UpdateNorm: a.Stats.DeltaNorm}
	for _, k := range a.Participants {
		info.Participants = append(info.Participants, int32(k))
		if d.entry {
			continue // scripts report no label histograms
		}
		lh := &pb.LabelHistogram{}
		for _, v := range d.hists[k] {
			lh.Counts = append(lh.Counts, int32(v))
		}
		info.LabelHistograms = append(info.LabelHistograms, lh)
	}
	for _, k := range a.Missing {
		info.Missing = append(info.Missing, int32(k))
	}
	d.evals = append(d.evals, &pendingEval{info: info, train: a.Stats.TrainLoss, model: slices.Clone(a.Global)})
	d.sendEvalsLocked()
}

// sendEvalsLocked sends the evaluations not yet sent to the evaluator.
func (d *Driver) sendEvalsLocked() {
	if d.evaluator == nil {
		for _, c := range d.sessions {
			if c != nil {
				d.evaluator = c
				break
			}
		}
	}
	c := d.evaluator
	if c == nil {
		return // nobody to ask: the next client to join
	}
	for _, ev := range d.evals {
		if ev.sentTo == c {
			continue
		}
		ev.sentTo = c
		c.sendLocked(message{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Eval{Eval: &pb.EvalRequest{Round: ev.info.Round}}},
			model: ev.model, tag: &pb.TensorFrame{JobId: d.jobID, Generation: d.gen, Op: pb.Op_OP_BROADCAST, Step: int64(ev.info.Round), Phase: 1}})
	}
}

// evalLocked records the evaluator's result for the oldest pending round
// and ends the job after the last one.
func (d *Driver) evalLocked(c *session, r *pb.ClientEval) error {
	if len(d.evals) == 0 || d.evals[0].sentTo != c || d.evals[0].info.Round != r.Round {
		return status.Errorf(codes.InvalidArgument, "client %d: evaluation of round %d was not asked for", c.client, r.Round)
	}
	acc, loss := r.TestAccuracy, r.TestLoss
	if !(acc >= 0 && acc <= 1) || loss != loss || loss < 0 {
		return status.Errorf(codes.InvalidArgument, "client %d: evaluation of round %d: accuracy %v must be in [0, 1] and loss %v ≥ 0", c.client, r.Round, acc, loss)
	}
	if err := checkMetrics(r.Metrics); err != nil {
		return status.Errorf(codes.InvalidArgument, "client %d: evaluation of round %d: %v", c.client, r.Round, err)
	}
	ev := d.evals[0]
	d.evals = d.evals[1:]
	d.metricsLocked(c.client, int(r.Round), "evaluate", r.Metrics)
	te := &pb.TaskEval{JobId: d.jobID, Rank: int32(c.client), Generation: d.gen, Epoch: ev.info.Round, Step: int64(ev.info.Round),
		TestAccuracy: acc, TestLoss: loss, TrainLoss: ev.train, Round: ev.info}
	d.last = te
	d.emitLocked(Event{Kind: pb.EventKind_EVENT_KIND_EVAL, Eval: te})
	if d.finished && len(d.evals) == 0 {
		d.succeedLocked()
	}
	return nil
}

// succeedLocked ends the job after its final evaluation. The clients hear
// FederationDone once the coordinator has ended the job (and aborted the
// driver), so that no client's report reaches a job still running.
func (d *Driver) succeedLocked() {
	cnt := d.srv.Counters()
	msg := fmt.Sprintf("test accuracy %.2f%% after %d round(s)", 100*d.last.TestAccuracy, d.rounds)
	if cnt.Stale > 0 || cnt.FailedRounds > 0 {
		msg += fmt.Sprintf("; %d stale update(s) refused (%d late), %d round(s) failed", cnt.Stale, cnt.Late, cnt.FailedRounds)
	}
	d.logLocked(map[string]any{"kind": "federation", "rounds": d.rounds, "stale_updates": cnt.Stale, "late_updates": cnt.Late,
		"rejected_updates": cnt.Rejected, "failed_rounds": cnt.FailedRounds, "lost_workers": d.nLost})
	res := &pb.JobResult{TestAccuracy: d.last.TestAccuracy, TestLoss: d.last.TestLoss, TrainLoss: d.lastTrain,
		Epochs: int32(d.rounds), Steps: int64(d.closed), ParameterChecksum: models.Checksum(d.srv.Global())}
	d.doneMsg = msg
	d.endLocked(pb.JobState_JOB_STATE_SUCCEEDED, msg, res)
}

// clientLostLocked: a lost worker's client misses the rounds it is
// sampled for; the job fails only when every client is lost.
func (d *Driver) clientLostLocked(client int, workerID, reason string) {
	if !d.lost[client] {
		d.lost[client] = true
		d.nLost++
	}
	if d.nLost == d.n {
		d.failLocked(fmt.Sprintf("every client is lost; the last, worker %s (client %d): %s", workerID, client, reason))
		return
	}
	msg := fmt.Sprintf("worker %s (client %d) lost: %s; it is missing from the rounds it is sampled for", workerID, client, reason)
	d.emitLocked(Event{Kind: pb.EventKind_EVENT_KIND_LOG, Message: msg})
	d.logLocked(map[string]any{"kind": "client_lost", "client": client, "worker": workerID, "reason": reason})
	if !d.begun && d.allInLocked() {
		d.startLocked(d.now()) // the others are in: no need to wait for it
		return
	}
	d.dropLostLocked() // the open round need not wait for it
}

// joinLocked registers a client's stream and catches it up: the open
// round if it is sampled and has not answered, and the evaluations if it
// becomes the evaluator. The first round opens when every client is in.
func (d *Driver) joinLocked(c *session, hist []int) error {
	if d.sessions[c.client] != nil {
		return status.Errorf(codes.AlreadyExists, "client %d of job %s is already connected", c.client, d.jobID)
	}
	f := d.spec.GetFederated()
	if f.GetReweighting() == "class-balanced" && d.weights[c.client] == nil {
		w, err := federated.ClassBalancedWeights(hist, f.GetBeta())
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "client %d: %v", c.client, err)
		}
		d.weights[c.client] = make([]float32, len(w))
		for i, v := range w {
			d.weights[c.client][i] = float32(v)
		}
	}
	d.sessions[c.client] = c
	d.hists[c.client] = hist
	c.sendLocked(message{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Joined{Joined: &pb.Joined{Rounds: int32(d.rounds)}}}})
	if d.open != nil {
		d.sendRoundLocked(c)
	}
	d.sendEvalsLocked()
	if !d.begun && d.allInLocked() {
		d.startLocked(d.now())
	}
	return nil
}

// allInLocked reports whether every client has joined or is lost: the
// first round need not wait any longer.
func (d *Driver) allInLocked() bool {
	for k, c := range d.sessions {
		if c == nil && !d.lost[k] {
			return false
		}
	}
	return true
}

// leaveLocked forgets a client's stream; its pending evaluations go to
// the next evaluator.
func (d *Driver) leaveLocked(c *session) {
	if d.sessions[c.client] != c {
		return
	}
	d.sessions[c.client] = nil
	if d.evaluator == c {
		d.evaluator = nil
		if d.activeLocked() {
			d.sendEvalsLocked()
		}
	}
}

// updateLocked offers a complete update to the Server and maps its
// refusals to gRPC codes.
func (d *Driver) updateLocked(c *session, u federated.Update) error {
	if !d.activeLocked() {
		return status.Errorf(codes.FailedPrecondition, "job %s has ended", d.jobID)
	}
	if !d.begun {
		return status.Errorf(codes.FailedPrecondition, "client %d: update for round %d before the first round opened", c.client, u.Round)
	}
	acts, err := d.srv.Submit(d.now(), u)
	var stale *federated.StaleRoundError
	var unknown *federated.UnknownClientError
	var invalid *federated.InvalidUpdateError
	refusal := errors.As(err, &stale) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.Is(err, federated.ErrDuplicate) || errors.Is(err, federated.ErrNotRunning)
	if refusal {
		d.applyLocked(acts, nil)
	} else {
		d.applyLocked(acts, err)
	}
	switch {
	case err == nil:
		c.sendLocked(message{resp: &pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Accepted{Accepted: &pb.UpdateAccepted{Round: int32(u.Round)}}}})
		return nil
	case stale != nil:
		d.logLocked(map[string]any{"kind": "stale_update", "client": c.client, "round": u.Round, "late": stale.Late, "current_round": stale.Current})
		d.log.Info("stale federated update refused", "job", d.jobID, "client", c.client, "round", u.Round, "late", stale.Late)
		return status.Error(codes.Aborted, err.Error())
	case unknown != nil || invalid != nil:
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, federated.ErrDuplicate):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, federated.ErrNotRunning):
		return status.Errorf(codes.FailedPrecondition, "job %s: %v", d.jobID, err)
	}
	return status.Errorf(codes.Aborted, "job %s failed: %v", d.jobID, err)
}
