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
// job whose ranks train the whole model in the worker).
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
	case IsEntrypoint(s):
		return errf("collective.transport", "%s for an entrypoint job %s", t, notImplementedSuffix)
	}
	return nil
}
