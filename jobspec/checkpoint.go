package jobspec

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// CheckpointDue reports whether a normalized spec's checkpoint settings
// ask for a checkpoint after step (the 1-based count of steps taken):
// every_steps divides step, or an epoch ends (epochEnd, epoch 0-based)
// whose number every_epochs divides, or every_seconds have passed since
// the last checkpoint (sinceLast). Ring workers, the parameter server and
// the fedavg simulation (where a round is a step and an epoch) share it.
func CheckpointDue(s *pb.JobSpec, step int64, epochEnd bool, epoch int, sinceLast time.Duration) bool {
	cs := s.GetCheckpoint()
	switch {
	case cs.GetEverySteps() > 0 && step%cs.GetEverySteps() == 0:
		return true
	case epochEnd && cs.GetEveryEpochs() > 0 && (epoch+1)%int(cs.GetEveryEpochs()) == 0:
		return true
	case cs.GetEverySeconds() > 0 && sinceLast.Seconds() >= cs.GetEverySeconds():
		return true
	}
	return false
}

// CheckpointHash identifies a spec in checkpoints (checkpoint.Meta's
// SpecHash): a resume refuses a checkpoint written for another spec. The
// number of workers and the parallelism are left out, as a resume may
// change them.
func CheckpointHash(spec *pb.JobSpec) string {
	s := proto.Clone(spec).(*pb.JobSpec)
	s.Workers, s.MinWorkers, s.MaxWorkers = nil, 0, 0
	s.Parallelism = nil // checkpoints hold the whole model, whatever the cut
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// CheckpointsOn reports whether a normalized spec asks for checkpoints.
func CheckpointsOn(s *pb.JobSpec) bool {
	c := s.GetCheckpoint()
	return c.GetEverySteps() > 0 || c.GetEveryEpochs() > 0 || c.GetEverySeconds() > 0
}

func normalizeCheckpoint(s *pb.JobSpec) error {
	c := s.Checkpoint
	if c == nil {
		return nil
	}
	switch {
	case c.EverySteps < 0:
		return errf("checkpoint.every_steps", "%d is negative", c.EverySteps)
	case c.EveryEpochs < 0:
		return errf("checkpoint.every_epochs", "%d is negative", c.EveryEpochs)
	case c.EverySeconds < 0 || math.IsNaN(c.EverySeconds) || math.IsInf(c.EverySeconds, 0):
		return errf("checkpoint.every_seconds", "%v must be a number >= 0", c.EverySeconds)
	case c.Keep < 0 || c.Keep > 1000:
		return errf("checkpoint.keep", "%d out of range; allowed 1..1000 (0: default 3)", c.Keep)
	}
	if !CheckpointsOn(s) {
		if c.Keep != 0 {
			return errf("checkpoint.keep", "needs every_steps, every_epochs or every_seconds")
		}
		return nil
	}
	if c.Keep == 0 {
		c.Keep = 3
	}
	return nil
}

// checkElastic: a job that may lose workers (min_workers < workers)
// must be a ring job; its ranks recover from in-memory snapshots, and
// from its checkpoints (if it writes them) when no survivor holds one.
func checkElastic(s *pb.JobSpec) error {
	if s.MinWorkers >= s.GetWorkers() {
		return nil
	}
	if s.Mode != "ring" {
		return errf("min_workers", "elastic jobs (min_workers %d < workers %d) in mode %s %s; use mode ring", s.MinWorkers, s.GetWorkers(), s.Mode, notImplementedSuffix)
	}
	return nil
}
