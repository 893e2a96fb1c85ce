package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ringTask is a ring rank's synchronizer for one task: ringSync's
// collectives and optimiser, and what a restart of the job needs — the
// generation's agreement on the state it starts from (ringSync.agree), an
// in-memory snapshot after every step, and rank 0's checkpoints, which
// every rank helps write when they must carry each rank's compression
// state.
type ringTask struct {
	*ringSync
	localGradient
	wholeModel
	a     *pb.Assignment
	net   *models.Network
	rep   *reporter
	log   *slog.Logger
	snaps *jobSnapshots // this rank's, kept by the worker across generations
	// ckpt writes the checkpoints: set on rank 0, and on every rank when
	// gather; nil when the job writes none or this rank takes no part.
	ckpt      *checkpointer
	modelMeta map[string]string // for ckpt (taskEnv.modelMeta)
	// gather: every rank takes part in a checkpoint, as rank 0 gathers
	// their error-feedback residuals.
	gather bool
}

// newRingTask wraps rs for one task; the snapshots are the worker's for
// the job (they outlive the task for the job's next generation), or the
// task's own without a store.
func newRingTask(rs *ringSync, a *pb.Assignment, env *taskEnv, net *models.Network) *ringTask {
	r := &ringTask{ringSync: rs, a: a, net: net, rep: env.rep, log: env.log, snaps: &jobSnapshots{}, modelMeta: env.modelMeta}
	if env.snaps != nil {
		r.snaps = env.snaps.forJob(a.JobId)
	}
	return r
}

// start implements synchronizer: every generation of a ring job starts
// by agreeing on its state — the newest in-memory snapshot the ranks
// share, else the checkpoint, else scratch (see ringSync.agree) — and
// rank 0 tells the coordinator which it was.
func (r *ringTask) start(ctx context.Context, from resumeFrom) (origin, error) {
	a := r.a
	rank, world := int(a.Rank), int(a.WorldSize)
	ckptStep := int64(-1)
	if from.ckpt != nil {
		ckptStep = from.at.step
	}
	sp, err := r.agree(ctx, r.snaps, a.Generation, ckptStep, a.TrainedSteps, r.net)
	if err != nil {
		return origin{}, err
	}
	at := from.at
	switch sp.source {
	case fromMemory:
		at = position{step: sp.step, epoch: sp.epoch, consumed: sp.consumed} // newer than the checkpoint
		r.log.Info("resumed from an in-memory snapshot", "job", a.JobId, "generation", a.Generation, "source_rank", sp.srcRank,
			"step", at.step, "newest_step", sp.newest, "epoch", at.epoch, "consumed", at.consumed, "seconds", sp.took.Seconds())
	case fromCheckpoint:
		if err := restoreCompression(from.ckpt, rank, world, r.state, r.log, a.JobId); err != nil {
			return origin{}, err
		}
		if err := restoreScaler(from.ckpt, r.scaler); err != nil {
			return origin{}, err
		}
	}
	r.total = from.plan.total(at)
	if rank == 0 {
		st := &pb.TaskStarted{JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, Step: at.step, Source: sp.source,
			SourceRank: int32(sp.srcRank), NewestStep: sp.newest, AgreeSeconds: sp.took.Seconds()}
		if sp.source == fromCheckpoint {
			st.Checkpoint = a.ResumeFrom
		}
		r.rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Started{Started: st}})
	}
	if sp.source == fromCheckpoint {
		if err := restoreCheckpoint(from.ckpt, a.ResumeFrom, a.Spec, r.net, r.optim); err != nil {
			return origin{}, err
		}
		r.steps = at.step
	}
	// The state this generation starts from is its first snapshot;
	// snapshots of earlier generations are gone.
	r.snaps.reset()
	r.snaps.take(a.Generation, at.step, at.epoch, at.consumed, r.net, r.optim, r.state, r.scaler)
	if a.CheckpointDir != "" {
		// With per-rank compression state (error feedback) every rank
		// takes part in a checkpoint: rank 0 gathers their residuals.
		r.gather = r.gathersCompression()
		if rank == 0 || r.gather {
			r.ckpt = &checkpointer{dir: a.CheckpointDir, spec: a.Spec, jobID: a.JobId, world: world, lastSave: time.Now(), meta: r.modelMeta}
		}
	}
	return origin{at: at, source: sp.source}, nil
}

// step implements synchronizer: ringSync's step, whose error carries the
// ring's frame counts.
func (r *ringTask) step(ctx context.Context, grads, params []float32) error {
	if err := r.ringSync.step(ctx, grads, params); err != nil {
		return r.withLinks(err)
	}
	return nil
}

// completed implements synchronizer: a snapshot of the state at at, and
// a checkpoint when rank 0 decides one is due (every rank that takes
// part hears its decision).
func (r *ringTask) completed(ctx context.Context, epoch int, at position) error {
	r.snaps.take(r.a.Generation, at.step, at.epoch, at.consumed, r.net, r.optim, r.state, r.scaler)
	if r.ckpt == nil {
		return nil
	}
	due := r.ckpt.due(at.step, at.epoch > epoch, epoch, time.Now())
	if r.gather {
		var err error
		if due, err = r.decideCheckpoint(ctx, due, r.a.Spec.GetCheckpoint().GetEverySeconds() > 0); err != nil {
			return err
		}
	}
	if !due {
		return nil
	}
	return r.save(ctx, at, r.gather)
}

// stopped implements synchronizer: rank 0 writes a checkpoint of the
// state at at, with its own compression state only (the ring may be
// broken).
func (r *ringTask) stopped(ctx context.Context, at position) {
	if r.ckpt == nil || r.a.Rank != 0 {
		return
	}
	if err := r.save(ctx, at, false); err != nil {
		r.log.Warn("checkpoint at cancellation failed", "job", r.a.JobId, "err", err)
	}
}

// save writes a checkpoint of the state at at (rank 0); with gather
// every rank calls it at the same step.
func (r *ringTask) save(ctx context.Context, at position, gather bool) error {
	extra, err := r.compressionExtra(ctx, gather)
	if err != nil {
		return err
	}
	r.scalerExtra(extra)
	if r.a.Rank != 0 {
		return nil
	}
	path, err := r.ckpt.save(r.net, r.optim, at.step, at.epoch, at.consumed, extra, time.Now())
	if err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	r.log.Debug("checkpoint written", "job", r.a.JobId, "path", path)
	return nil
}

// stats implements synchronizer.
func (r *ringTask) stats() syncStats {
	s := syncStats{compress: r.reducer.Stats(), snapshots: r.snaps.taken, snapshotCopying: r.snaps.copying}
	if st, ok := r.ring.(ringStatser); ok {
		_, s.leftWait = st.WaitStats()
	}
	r.scalerStats(&s)
	return s
}

// ringStatser is a ring that times its waits for the left neighbour and
// counts its frames (ringrpc's does).
type ringStatser interface {
	WaitStats() (collectives int64, waited time.Duration)
	FrameCounts() (sent, arrived int64)
	LeftIdle() time.Duration
}

// ringFailure is a ring-mode task's error with the ring's frame counts at
// the time it failed, which the coordinator compares link by link to find
// a link that lost frames.
type ringFailure struct {
	err   error
	links *pb.RingLinks
}

func (e *ringFailure) Error() string { return e.err.Error() }

func (e *ringFailure) Unwrap() error { return e.err }

// withLinks wraps err with the ring's frame counts, if it keeps them.
func (r *ringTask) withLinks(err error) error {
	st, ok := r.ring.(ringStatser)
	if !ok {
		return err
	}
	sent, arrived := st.FrameCounts()
	return &ringFailure{err: err, links: &pb.RingLinks{FramesSent: sent, FramesReceived: arrived, LeftIdleSeconds: st.LeftIdle().Seconds()}}
}
