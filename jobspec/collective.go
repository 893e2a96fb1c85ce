package jobspec

import (
	"slices"
	"strings"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Transports are the allowed collective.transport values ("" is grpc).
var Transports = []string{"grpc", "shm", "auto"}

// Algorithms are the collective.algorithm values ("" is auto), the
// spellings of aggregator.ParseAlgorithm. TrainingAlgorithms are those a
// ring-mode job's training all-reduce runs today: the worker's ring is a
// neighbour-only transport, which carries the ring algorithm alone.
var (
	Algorithms         = []string{"auto", "ring", "halving_doubling", "tree"}
	TrainingAlgorithms = []string{"auto", "ring"}
)

// SharedMemory reports whether s asks its ring to try shared memory.
func SharedMemory(s *pb.JobSpec) bool {
	t := s.GetCollective().GetTransport()
	return t == "shm" || t == "auto"
}

// normalizeCollective checks collective.transport: a known value, and
// shared memory only where it is implemented (the ring of a ring-mode
// job whose ranks train the whole model, in the worker or in an
// entrypoint's script through the agent); and collective.algorithm: a
// known value, and one training runs.
func normalizeCollective(s *pb.JobSpec) error {
	if a := s.GetCollective().GetAlgorithm(); a != "" && !slices.Contains(Algorithms, a) {
		return errf("collective.algorithm", "unknown algorithm %q; allowed: %s", a, strings.Join(Algorithms, allowedListSeparator))
	} else if a != "" && !slices.Contains(TrainingAlgorithms, a) {
		return errf("collective.algorithm", "%s for a training all-reduce %s (the worker's ring carries the ring algorithm only; `gradsync bench allreduce --algorithm %s` runs it); allowed: %s",
			a, notImplementedSuffix, a, strings.Join(TrainingAlgorithms, allowedListSeparator))
	}
	t := s.GetCollective().GetTransport()
	if t != "" && !slices.Contains(Transports, t) {
		return errf("collective.transport", "unknown transport %q; allowed: %s", t, strings.Join(Transports, allowedListSeparator))
	}
	if !SharedMemory(s) {
		return nil
	}
	switch {
	case s.GetMode() != "ring":
		return errf("collective.transport", "%s with mode %s %s; use mode ring", t, s.GetMode(), notImplementedSuffix)
	case Pipelined(s):
		return errf("collective.transport", "%s with pipeline stages %s", t, notImplementedSuffix)
	}
	return nil
}
