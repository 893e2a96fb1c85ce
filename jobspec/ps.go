package jobspec

import (
	"net"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// maxStaleness bounds parameter_server.staleness.
const maxStaleness = 10000

// PSConsistency values.
const (
	PSSync    = "sync"
	PSAsync   = "async"
	PSBounded = "bounded"
)

// normalizePS fills in and checks parameter_server (after compression and
// checkpoint are normalized). The combinations a sharded or asynchronous
// parameter server does not support are refused, each saying why:
//
//   - more than one shard, or shards in `gradsync aggregator` processes,
//     with checkpoints: the server writes a ps job's checkpoints from the
//     one shard it holds; gathering K shards is not implemented yet;
//   - more than one shard with compression: the schemes compress per
//     layer (top-k, int8 chunks, PowerSGD's matrices), and ranges cut
//     across layers;
//   - more than one shard with grad_clip_norm: the clip is by the global
//     norm, which no shard sees;
//   - async or bounded with compression or checkpoints: PowerSGD and
//     error feedback assume every rank's push of a step is summed, and a
//     checkpoint needs the ranks at one step.
func normalizePS(s *pb.JobSpec) error {
	if s.ParameterServer == nil {
		s.ParameterServer = &pb.ParameterServerSpec{}
	}
	ps := s.ParameterServer
	if ps.Shards == 0 {
		ps.Shards = 1
	}
	if ps.Shards < 1 || ps.Shards > maxPSShards {
		return errf("parameter_server.shards", "%d out of range; allowed 1..%d", ps.Shards, maxPSShards)
	}
	if ps.Consistency == "" {
		ps.Consistency = defaultPSConsistency
	}
	switch ps.Consistency {
	case PSSync, PSAsync:
		if ps.Staleness != 0 {
			return errf("parameter_server.staleness", "needs consistency bounded (consistency is %s)", ps.Consistency)
		}
	case PSBounded:
		if ps.Staleness < 0 || ps.Staleness > maxStaleness {
			return errf("parameter_server.staleness", "%d out of range; allowed 0..%d steps ahead of the slowest worker", ps.Staleness, maxStaleness)
		}
	default:
		return errf("parameter_server.consistency", "unknown consistency %q; allowed: sync, async, bounded", ps.Consistency)
	}
	if n := len(ps.Addresses); n > 0 {
		if int32(n) != ps.Shards {
			return errf("parameter_server.addresses", "%d addresses for %d shard(s); give one `gradsync aggregator` address per shard, or none to host the shards in the server", n, ps.Shards)
		}
		for i, a := range ps.Addresses {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" || len(a) > maxDataDirLen {
				return errf("parameter_server.addresses", "address %d %q is not host:port", i, a)
			}
		}
	}
	sharded := ps.Shards > 1 || len(ps.Addresses) > 0
	if s.Mode != "ps" {
		if sharded || ps.Consistency != PSSync {
			return errf("parameter_server", "applies to mode ps (mode is %s)", s.Mode)
		}
		return nil
	}
	compressed := s.GetCompression().GetType() != defaultCompression
	switch {
	case sharded && CheckpointsOn(s):
		return errf("parameter_server.shards", "checkpoints with %d shard(s) in `gradsync aggregator` processes or more than one shard %s; use one shard in the server", ps.Shards, notImplementedSuffix)
	case ps.Shards > 1 && compressed:
		return errf("parameter_server.shards", "%s compression with %d shards %s (compression works per layer; shards cut across layers); use one shard", s.Compression.Type, ps.Shards, notImplementedSuffix)
	case ps.Shards > 1 && s.GradClipNorm != 0:
		return errf("parameter_server.shards", "grad_clip_norm with %d shards %s (the clip is by the global norm, which no shard sees); use one shard", ps.Shards, notImplementedSuffix)
	case ps.Consistency != PSSync && compressed:
		return errf("parameter_server.consistency", "%s with %s compression %s; use consistency sync", ps.Consistency, s.Compression.Type, notImplementedSuffix)
	case ps.Consistency != PSSync && CheckpointsOn(s):
		return errf("parameter_server.consistency", "%s with checkpoints %s (the workers are at different steps); use consistency sync", ps.Consistency, notImplementedSuffix)
	}
	return nil
}

// PSSharded reports whether a normalized ps spec runs more than one shard
// or its shards in aggregator processes.
func PSSharded(s *pb.JobSpec) bool {
	ps := s.GetParameterServer()
	return ps.GetShards() > 1 || len(ps.GetAddresses()) > 0
}
