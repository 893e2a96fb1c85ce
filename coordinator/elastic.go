package coordinator

import (
	"fmt"
	"slices"
	"time"

	"github.com/gradsync/gradsync/pipeline"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The core's side of elastic recovery: an elastic ring job (min_workers
// < workers) that loses a worker, or has one cut off from its ring,
// recovers onto the survivors and idle workers; one that runs below its
// size grows back onto idle workers. Each job's Recovery holds the phase;
// the shell pins the checkpoint a new generation falls back to
// (PinCheckpoint → Pinned) and announces what happened.

// Pinned: the checkpoint Job's recovery falls back to is pinned at Path
// ("" when the job has none; Err when pinning failed).
type Pinned struct {
	At   time.Time
	Job  string
	Path string
	Err  error
}

// Started: rank Rank (Worker) of Job said where its generation's state
// came from (rank 0's TaskStarted).
type Started struct {
	At          time.Time
	Worker, Job string
	Rank        int
	Task        *pb.TaskStarted
}

func (i Pinned) when() time.Time  { return i.At }
func (i Started) when() time.Time { return i.At }

// PinCheckpoint: pin Job's latest checkpoint (off the lock) as the
// fallback of generation Generation (tag "g<Generation>"), then feed
// Pinned.
type PinCheckpoint struct {
	Job        string
	Generation uint64
}

// Recovering: Job's generation Generation starts on Workers workers
// after the loss of Lost (at Address, for Reason; "" for growth from
// Before workers), falling back to Checkpoint; the old generation had
// trained LastStep steps.
type Recovering struct {
	Job, Lost, Address, Reason, Checkpoint string
	Generation                             uint64
	Workers, Before                        int
	LastStep                               int64
}

// GenerationStarted: Job's generation said where its state came from
// (From); Outcome, when set, ended a recovery or growth.
type GenerationStarted struct {
	Job, From  string
	Generation uint64
	Source     string
	Outcome    *Outcome
}

// Recovered: Job's recovery (or growth) ended at its new generation's
// first progress report.
type Recovered struct {
	Job        string
	Generation uint64
	Outcome    Outcome
}

// RingCut: the frame counts name rank Rank (Worker, at Address) of Job's
// generation Generation as cut off from the ring, with Evidence.
type RingCut struct {
	Job, Worker, Address, Evidence string
	Generation                     uint64
	Rank                           int
}

func (PinCheckpoint) action()     {}
func (Recovering) action()        {}
func (GenerationStarted) action() {}
func (Recovered) action()         {}
func (RingCut) action()           {}

// lostWorker is what a recovery needs of the worker it recovers from.
type lostWorker struct {
	id, address string
	silent      time.Duration
}

// elastic reports whether j recovers from lost workers.
func (j *Job) elastic() bool { return j.Mode == "ring" && j.min < j.size }

// workerLost fails or recovers the job a lost worker held, running or
// placed and being prepared (a real federated client of a running job
// is only missing from its rounds: the shell's round driver sees to
// it).
func (c *Core) workerLost(out []Action, j *Job, w *Worker, reason string, silent time.Duration) []Action {
	running := j.State == pb.JobState_JOB_STATE_RUNNING
	if c.closed || Final(j.State) || (running && j.realClients) {
		return out
	}
	ranks := j.Members
	if !running {
		ranks = j.Placed
	}
	msg := fmt.Sprintf("worker %s (%s, %s) lost: %s", w.ID, j.rankName(slices.Index(ranks, w.ID), len(ranks)), w.Address, reason)
	out, ok := c.recover(out, j, &lostWorker{id: w.ID, address: w.Address, silent: silent}, reason, msg)
	if ok {
		return out
	}
	return c.end(out, j, pb.JobState_JOB_STATE_FAILED, msg, nil)
}

// recover keeps an elastic ring job going after it lost a worker: the
// survivors (and idle workers, up to the job's size) stop the broken
// step, the generation is bumped, and the new generation's ranks agree
// on the newest state one of them holds in memory, or else resume from
// the latest checkpoint. With lost nil it grows a job that runs below
// its size onto idle workers the same way. It reports whether it will
// (false: the job cannot, and the caller fails it with failMsg).
//
// It runs in two halves: this one decides (the job can recover with the
// workers there are) and asks for the checkpoint pin; pinned then plans
// the new generation again with the workers there are by then, or fails
// the job with failMsg.
func (c *Core) recover(out []Action, j *Job, lost *lostWorker, reason, failMsg string) ([]Action, bool) {
	if !j.elastic() {
		return out, false
	}
	if j.rec.Pinning() {
		// A recovery is already on its way; it leaves out every worker
		// lost by then. Growth waits for it.
		return out, lost != nil
	}
	lostID := ""
	if lost != nil {
		lostID = lost.id
	}
	if _, ok := c.planGeneration(j, lostID, lost == nil); !ok {
		return out, false
	}
	p := Pin{Gen: j.Generation, Reason: reason, FailMsg: failMsg}
	if lost != nil {
		p.Lost, p.Address, p.Silent = lost.id, lost.address, lost.silent
	}
	j.rec.AwaitPin(p)
	return append(out, PinCheckpoint{Job: j.ID, Generation: j.Generation + 1}), true
}

// survivors lists j's workers that are still there, but lost and those
// evicted from its ring.
func (c *Core) survivors(j *Job, lost string) []string {
	var ids []string
	for _, id := range j.Members {
		if w := c.workers[id]; w != nil && id != lost && w.State != pb.WorkerState_WORKER_STATE_LOST && !j.rec.Evicted(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// pinned is recover's second half, once the checkpoint to fall back to
// is pinned.
func (c *Core) pinned(out []Action, in Pinned) []Action {
	j := c.jobs[in.Job]
	if j == nil {
		return out
	}
	p, ok := j.rec.Pinned()
	if !ok || c.closed || j.State != pb.JobState_JOB_STATE_RUNNING || j.Generation != p.Gen {
		return out // the job ended or moved on meanwhile
	}
	fail := func() []Action {
		if p.FailMsg != "" {
			return c.end(out, j, pb.JobState_JOB_STATE_FAILED, p.FailMsg, nil)
		}
		return out
	}
	if in.Err != nil {
		return fail()
	}
	path := in.Path
	if path == "" {
		path = j.resumeFrom
	}
	survivors := c.survivors(j, p.Lost)
	ids, ok := c.planGeneration(j, p.Lost, p.Lost == "")
	if !ok {
		return fail()
	}
	var lastStep int64
	for _, s := range j.steps {
		lastStep = max(lastStep, s)
	}
	j.resumeFrom = path
	j.rec.Begin(in.At, p.Lost, p.Silent, lastStep, path)
	for _, id := range j.Members { // stop the current generation's tasks
		if id != p.Lost {
			out = append(out, CancelTask{Job: j.ID, Worker: id, Reason: fmt.Sprintf("recovering: generation %d", j.Generation+1), KeepState: true})
		}
	}
	out = c.startGeneration(out, j, j.Generation+1, ids)
	// A pipeline job's generation runs on whole replicas: survivors left
	// out of it are free for other work.
	var left []string
	for _, id := range survivors {
		if !slices.Contains(ids, id) {
			left = append(left, id)
		}
	}
	c.release(j.ID, left)
	return append(out, Recovering{Job: j.ID, Lost: p.Lost, Address: p.Address, Reason: p.Reason, Checkpoint: path,
		Generation: j.Generation, Workers: len(ids), Before: len(survivors), LastStep: lastStep})
}

// started takes a generation's TaskStarted: it may end a recovery.
func (c *Core) started(out []Action, in Started) ([]Action, error) {
	j := c.jobs[in.Job]
	st := in.Task
	if j == nil || j.State != pb.JobState_JOB_STATE_RUNNING || st == nil {
		return out, nil
	}
	if in.Rank < 0 || in.Rank >= len(j.Members) || j.Members[in.Rank] != in.Worker {
		return out, &RankError{Worker: in.Worker, Job: j.ID, Rank: in.Rank}
	}
	if st.Generation != j.Generation {
		return out, nil
	}
	a := GenerationStarted{Job: j.ID, From: StartedFrom(st), Generation: st.Generation, Source: st.Source}
	if o, ended := j.rec.Started(in.At, st, len(j.Members)); ended {
		a.Outcome = &o
	}
	return append(out, a), nil
}

// rankFailed takes a ring rank's failure report. Once the ranks' frame
// counts name the rank cut off, it is evicted (an elastic job recovers
// without it) or the job fails naming it. Otherwise a broken ring is
// usually a lost peer, which the coordinator sees a moment later: it
// then names the lost worker (or, for an elastic job, recovers); the
// job fails with the rank's own error only if nothing else happens
// within the heartbeat timeout.
func (c *Core) rankFailed(out []Action, j *Job, in TaskDone, msg string) []Action {
	if in.CommandFailed {
		return c.commandFailed(out, j, in, msg)
	}
	rank, why, ok := j.rec.RingFailed(j.Generation, len(j.Members), in.Rank, in.Links, j.minIdle)
	var w *Worker
	if ok {
		w = c.workers[j.Members[rank]]
	}
	if w == nil {
		j.rec.RankFailed(in.At, j.Generation, msg, c.timeout)
		return out
	}
	reason := fmt.Sprintf("cut off from the ring (rank %d): %s", rank, why)
	out = append(out, RingCut{Job: j.ID, Worker: w.ID, Address: w.Address, Evidence: why, Generation: j.Generation, Rank: rank})
	j.rec.Evict(w.ID) // never taken back into this job
	// The worker is still connected (its heartbeats arrive) and BUSY, so
	// recovery neither keeps it nor takes it as an idle worker.
	failMsg := fmt.Sprintf("worker %s (%s) %s", w.ID, w.Address, reason)
	out, ok = c.recover(out, j, &lostWorker{id: w.ID, address: w.Address, silent: in.At.Sub(w.Seen)}, reason, failMsg)
	if !ok {
		out = c.end(out, j, pb.JobState_JOB_STATE_FAILED, failMsg, nil)
	}
	if w.Job == j.ID {
		out = append(out, CancelTask{Job: j.ID, Worker: w.ID, Reason: "evicted: " + reason})
	}
	c.release(j.ID, []string{w.ID})
	return out
}

// commandFailed takes the failure of an entrypoint rank's own command
// (it crashed, exited non-zero or hung while its ring was whole): there
// is nothing to wait for. An elastic job evicts the rank's worker, as a
// worker cut off from its ring is, and recovers without it — its
// commands restart, with the new generation, on the survivors and idle
// workers that run commands; any other job fails at once, naming it.
func (c *Core) commandFailed(out []Action, j *Job, in TaskDone, msg string) []Action {
	w := c.workers[in.Worker]
	if w == nil || !j.elastic() {
		return c.end(out, j, pb.JobState_JOB_STATE_FAILED, msg, nil)
	}
	j.rec.Evict(w.ID) // never taken back into this job
	reason := fmt.Sprintf("its command failed (rank %d): %s", in.Rank, in.Error)
	out, ok := c.recover(out, j, &lostWorker{id: w.ID, address: w.Address, silent: in.At.Sub(w.Seen)}, reason, msg)
	if !ok {
		out = c.end(out, j, pb.JobState_JOB_STATE_FAILED, msg, nil)
	}
	c.release(j.ID, []string{w.ID})
	return out
}

// due fails the jobs whose rank failure waited past its deadline with
// no recovery.
func (c *Core) due(out []Action, now time.Time) []Action {
	for _, j := range c.sortedJobs() {
		if msg, ok := j.rec.Due(now, j.Generation); ok && !Final(j.State) {
			out = c.end(out, j, pb.JobState_JOB_STATE_FAILED, msg, nil)
		}
	}
	return out
}

// grow grows elastic jobs running below their size onto idle workers
// nobody queued for (from their latest checkpoint).
func (c *Core) grow(out []Action) []Action {
	if c.closed || len(c.queue) > 0 {
		return out
	}
	for _, j := range c.sortedJobs() {
		if j.State == pb.JobState_JOB_STATE_RUNNING && !j.rec.Rejoining() && !j.rec.Pinning() && !j.AnyRankDone() &&
			len(j.Members) < j.size && j.elastic() {
			out, _ = c.recover(out, j, nil, "", "")
		}
	}
	return out
}

// Trained is the most steps job id is known to have trained (told to
// new generations, so that one that finds no state fails instead of
// starting over).
func (c *Core) Trained(id string) int64 {
	if j := c.jobs[id]; j != nil {
		return j.rec.Trained()
	}
	return 0
}

// RecoveryPhase is where job id's recovery stands.
func (c *Core) RecoveryPhase(id string) Phase {
	if j := c.jobs[id]; j != nil {
		return j.rec.Phase()
	}
	return Steady
}

// rankName names rank r of j's mesh of world ranks: "rank 2", or for a
// pipeline job "rank 2, pipeline stage 0 of 2, replica 1"
// (pipeline.Place's mesh, the one the workers build), for a label-sharded
// one "rank 2, label shard 0 of 2, replica 1", for a tensor-parallel one
// "rank 2, tensor rank 0 of 2, replica 1".
func (j *Job) rankName(r, world int) string {
	if l := j.labelShards; l > 1 && r >= 0 {
		return fmt.Sprintf("rank %d, label shard %d of %d, replica %d", r, r%l, l, r/l)
	}
	if tr := j.tensor; tr > 1 && r >= 0 {
		return fmt.Sprintf("rank %d, tensor rank %d of %d, replica %d", r, r%tr, tr, r/tr)
	}
	if j.stages > 1 && r >= 0 {
		if c, err := pipeline.Place(r, world, j.stages); err == nil {
			return fmt.Sprintf("rank %d, pipeline stage %d of %d, replica %d", r, c.Stage, c.Stages, c.Replica)
		}
	}
	return fmt.Sprintf("rank %d", r)
}
