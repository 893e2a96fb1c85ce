package psstep

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/data"
)

// Policy is a job's checkpoint settings: whether a checkpoint is wanted
// after step (the 1-based count of steps taken), given whether that
// step ended epoch (0-based) and the time since the last checkpoint
// (jobspec.CheckpointDue over the job's spec).
type Policy func(step int64, epochEnd bool, epoch int, sinceLast time.Duration) bool

// Checkpoints is the shard's checkpoint decision after each step. The
// shard holds no sampler, so it follows the ranks' from the step count:
// every rank trains the same number of lockstep steps of Batch examples
// over TrainN examples (data.Position), from where the job started.
type Checkpoints struct {
	Policy Policy
	// World ranks of Batch examples a step each, over TrainN training
	// examples (known from the ranks' joins; 0 before).
	World, Batch, TrainN int
	// Where the job started: the step, epoch and consumed positions of
	// the checkpoint it resumed from, or zeros.
	StartStep     int64
	StartEpoch    int
	StartConsumed int64
}

// Position is the ranks' sampler position after step steps of the job:
// the epoch in progress, the positions of its order consumed, and
// whether the last step ended an epoch (then consumed is 0 and epoch the
// next one). TrainN must be known.
func (c *Checkpoints) Position(step int64) (epoch int, consumed int64, epochEnd bool) {
	return data.Position(c.TrainN, c.World, c.Batch, c.StartEpoch, c.StartConsumed, step-c.StartStep)
}

// Decision is what the shard does after applying a step.
type Decision uint8

const (
	// NotDue: no checkpoint.
	NotDue Decision = iota
	// Save: write the checkpoint now; the shard holds all of it.
	Save
	// Gather: the checkpoint also holds each rank's own compression
	// state (error feedback); the step's Params ask for it (AskState)
	// and the checkpoint is written once every rank's is in.
	Gather
)

var decisionNames = [...]string{NotDue: "not-due", Save: "save", Gather: "gather"}

func (d Decision) String() string {
	if int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return fmt.Sprintf("Decision(%d)", uint8(d))
}

// Due decides on a checkpoint after step steps of the job (the shard
// just applied the last), sinceLast the last checkpoint was written;
// ownLen is the length of a rank's own compression state
// (compress.PSReceiver.OwnLen), 0 when the ranks hold none.
func (c *Checkpoints) Due(step int64, sinceLast time.Duration, ownLen int) Decision {
	epoch, _, end := c.Position(step)
	if end {
		epoch-- // the epoch that ended
	}
	switch {
	case !c.Policy(step, end, epoch, sinceLast):
		return NotDue
	case ownLen > 0:
		return Gather
	}
	return Save
}
