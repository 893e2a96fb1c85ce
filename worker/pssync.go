package worker

import (
	"context"
	"log/slog"
)

// psTask is a ps rank's synchronizer for one task: psClient's streams to
// the parameter-server shards. The parameter server keeps the job's state
// — it sends the parameters a rank starts from when it joins, and writes
// the checkpoints — so of what a restart needs this rank keeps nothing
// but its own compression state, restored from a checkpoint.
type psTask struct {
	*psClient
	localGradient
	unscaled
	wholeModel
	log *slog.Logger
}

// start implements synchronizer: the parameters arrived with the join
// (those of from's checkpoint, if any); this rank's compression state
// (error feedback, warm-start Q) is its own and comes from the
// checkpoint here.
func (p *psTask) start(_ context.Context, from resumeFrom) (origin, error) {
	if from.ckpt == nil {
		return origin{at: from.at, source: fromScratch}, nil
	}
	// No compression with several shards (jobspec): the first link's
	// pusher holds all of this rank's state.
	a := p.a
	if err := restoreCompression(from.ckpt, int(a.Rank), int(a.WorldSize), p.links[0].push, p.log, a.JobId); err != nil {
		return origin{}, err
	}
	return origin{at: from.at, source: fromCheckpoint}, nil
}

// beginStep implements synchronizer: a push needs the whole gradient.
func (*psTask) beginStep(context.Context, []float32) (func(from int), error) { return nil, nil }

// completed implements synchronizer: the parameter server decides on
// checkpoints and writes them.
func (*psTask) completed(context.Context, int, position) error { return nil }

// stopped implements synchronizer: the parameter server writes the
// checkpoint of a stopped job.
func (*psTask) stopped(context.Context, position) {}

// stats implements synchronizer: the pushes' compression counters and
// the shards' staleness receipts.
func (p *psTask) stats() syncStats {
	return syncStats{compress: p.compressStats(), staleness: p.psClient.stats}
}
