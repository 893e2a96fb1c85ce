package jobspec

import (
	"strings"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Entrypoint bounds.
const (
	maxEntryArgs     = 1024
	maxEntryArgLen   = 64 << 10
	maxEntryEnv      = 256
	maxEntryEnvValue = 64 << 10
)

// entrypointVars are the variables a worker sets for an entrypoint
// command; a job may not set them.
var entrypointVars = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}

// IsEntrypoint reports whether a job runs a user's command (spec.entrypoint)
// instead of gradsync's own engine.
func IsEntrypoint(s *pb.JobSpec) bool { return s.GetEntrypoint() != nil }

// normalizeEntrypoint checks an entrypoint job, before the mode's default
// is filled in (it is ring for such jobs). Only the ring path exists so
// far: the other modes, elastic sizes and checkpoints are refused as not
// implemented yet. Compression (any type) applies to the script's
// gradient buckets (the agent's shared-memory all-reduces), checked as
// for any ring job.
func normalizeEntrypoint(s *pb.JobSpec) error {
	e := s.GetEntrypoint()
	if e == nil {
		return nil
	}
	if len(e.Command) == 0 || e.Command[0] == "" {
		return errf("entrypoint.command", "is empty; give the program and its arguments, e.g. [python3, train.py]")
	}
	if len(e.Command) > maxEntryArgs {
		return errf("entrypoint.command", "has %d arguments; at most %d", len(e.Command), maxEntryArgs)
	}
	for i, a := range e.Command {
		if len(a) > maxEntryArgLen || strings.ContainsRune(a, 0) {
			return errf("entrypoint.command", "argument %d is longer than %d bytes or holds a NUL byte", i, maxEntryArgLen)
		}
	}
	if len(e.WorkingDir) > maxDataDirLen || strings.ContainsRune(e.WorkingDir, 0) {
		return errf("entrypoint.working_dir", "is longer than %d bytes or holds a NUL byte", maxDataDirLen)
	}
	if len(e.Env) > maxEntryEnv {
		return errf("entrypoint.env", "has %d variables; at most %d", len(e.Env), maxEntryEnv)
	}
	for k, v := range e.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00") || len(k) > 256:
			return errf("entrypoint.env", "%q is not a variable name", k)
		case strings.HasPrefix(k, "GRADSYNC_"):
			return errf("entrypoint.env", "%s: names starting with GRADSYNC_ are the worker's", k)
		case len(v) > maxEntryEnvValue || strings.ContainsRune(v, 0):
			return errf("entrypoint.env", "%s: the value is longer than %d bytes or holds a NUL byte", k, maxEntryEnvValue)
		}
		for _, r := range entrypointVars {
			if k == r {
				return errf("entrypoint.env", "%s is set by the worker for each rank", k)
			}
		}
	}
	if s.Mode == "" {
		s.Mode = "ring"
	}
	if s.Mode != "ring" {
		return errf("mode", "entrypoint jobs in mode %s %s; use mode ring", s.Mode, notImplementedSuffix)
	}
	if CheckpointsOn(s) {
		return errf("checkpoint", "checkpoints of entrypoint jobs %s (the script saves its own)", notImplementedSuffix)
	}
	return nil
}
