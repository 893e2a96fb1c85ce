package jobspec

import (
	"crypto/sha256"
	"encoding/hex"
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
// number of workers is left out, as a resume may change it.
func CheckpointHash(spec *pb.JobSpec) string {
	s := proto.Clone(spec).(*pb.JobSpec)
	s.Workers, s.MinWorkers, s.MaxWorkers = nil, 0, 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
