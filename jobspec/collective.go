package jobspec

import (
	"slices"
	"strings"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Transports are the allowed collective.transport values ("" is grpc).
var Transports = []string{"grpc", "shm", "auto"}

// SharedMemory reports whether s asks its ring to try shared memory.
func SharedMemory(s *pb.JobSpec) bool {
	t := s.GetCollective().GetTransport()
	return t == "shm" || t == "auto"
}

// normalizeCollective checks collective.transport: a known value, and
// shared memory only where it is implemented (the ring of a ring-mode
// job whose ranks train the whole model, in the worker or in an
// entrypoint's script through the agent).
func normalizeCollective(s *pb.JobSpec) error {
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
