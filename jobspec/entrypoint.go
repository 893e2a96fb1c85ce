package jobspec

import (
	"strings"
	"time"

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
// is filled in (it is ring for such jobs). Modes ring (the script
// all-reduces through its worker), ps (the coordinator hosts summation
// shards for the script's calls — paramserver.Sums; or `gradsync
// aggregator` processes do —, synchronous by nature; elastic sizes,
// compression and another consistency are refused: entrypointPS) and
// fedavg with real clients (the script is one federated client,
// gradsync.fl: checkEntrypointFedAvg) exist; checkpoints are refused as
// not implemented yet. Compression (any type) applies to a ring script's
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
	switch s.Mode {
	case "ring":
		// A script's ring goes over shared memory between the workers
		// of one host unless told otherwise (auto: gRPC between hosts,
		// and wherever shared memory cannot be set up); through gRPC,
		// with TLS between the workers, a script's buckets cost it far
		// more CPU than gloo's all-reduce in a DDP script.
		if s.GetCollective().GetTransport() == "" {
			if s.Collective == nil {
				s.Collective = &pb.CollectiveSpec{}
			}
			s.Collective.Transport = "auto"
		}
	case "fedavg":
	case "ps":
		if err := entrypointPS(s); err != nil {
			return err
		}
	default:
		return errf("mode", "entrypoint jobs in mode %s %s; use mode ring or ps (a data-parallel script) or fedavg (a federated client, gradsync.fl)", s.Mode, notImplementedSuffix)
	}
	if CheckpointsOn(s) {
		return errf("checkpoint", "gradsync-scheduled checkpoints of entrypoint jobs %s: the script saves its own state into the job's checkpoint folder when it chooses (gradsync.torch.save_checkpoint(state, step=N)), and submit --resume starts from the newest", notImplementedSuffix)
	}
	return nil
}

// entrypointPS refuses what an entrypoint job in mode ps cannot do: its
// parameter server's shards (the coordinator's, or `gradsync aggregator`
// processes) only sum the script's calls; the script keeps its
// parameters and optimiser.
func entrypointPS(s *pb.JobSpec) error {
	ps := s.GetParameterServer()
	if t := s.GetCompression().GetType(); t != "" && t != defaultCompression {
		return errf("compression.type", "%s compression of an entrypoint job in mode ps %s: the worker compresses a script's gradient buckets, with each bucket's error feedback, over the ring; the shards of mode ps only sum them (use mode ring with compression, or none)", t, notImplementedSuffix)
	}
	if c := ps.GetConsistency(); c != "" && c != PSSync {
		return errf("parameter_server.consistency", "%s: an entrypoint job's shards sum every rank's part of each call before they answer (sync); its script keeps its own parameters, so there is nothing to update asynchronously", c)
	}
	return nil
}

// checkEntrypointFedAvg refuses what a fedavg entrypoint job's clients
// (scripts written with gradsync.fl, one per worker) cannot do, once the
// federated settings are filled in. The script owns its model and data:
// the server knows neither its labels nor its batch-norm buffers (those
// the script returns from get_parameters are averaged as parameters, as
// in Flower), so the settings that need label histograms are refused, as
// is a partition of data the worker does not load, and simulating the
// clients in one worker (workers: 1), which is gradsync's own engine.
// FedAvg weighting by num_examples (or uniform), the server optimisers
// and robust rules, min_clients, fraction and deadlines apply as for Go
// clients; local_epochs, local_batch_size, client_lr and FedProx's mu go
// to the script's fit in its config.
func checkEntrypointFedAvg(s *pb.JobSpec) error {
	if !IsEntrypoint(s) || s.GetMode() != "fedavg" {
		return nil
	}
	f := s.GetFederated()
	switch {
	case !RealClients(s):
		return errf("workers", "%d: a fedavg entrypoint job runs one client (script) per worker; use workers ≥ 2 (simulated clients in one worker are gradsync's own engine)", s.GetWorkers())
	case s.GetPartition() != nil:
		return errf("partition", "a fedavg entrypoint job's scripts load their own data; partition applies to gradsync's own engine")
	case f.GetReweighting() == "class-balanced":
		return errf("federated.reweighting", "class-balanced needs each client's label histogram, which a script does not report; use none")
	case f.GetWeighting() == "label-balanced":
		return errf("federated.weighting", "label-balanced needs each client's label histogram, which a script does not report; use examples or uniform")
	}
	return nil
}

// FedJoinWait is how long a fedavg entrypoint job's scripts have to start
// and join its rounds (import torch, load their data) before the first
// round opens without them, and a worker waits for its script's join:
// the round deadline or the step timeout, whichever is longer.
func FedJoinWait(s *pb.JobSpec) time.Duration {
	return time.Duration(max(s.GetFederated().GetRoundDeadlineSeconds(), s.GetStepTimeoutSeconds()) * float64(time.Second))
}
