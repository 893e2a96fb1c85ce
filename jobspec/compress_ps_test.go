package jobspec

import (
	"cmp"
	"testing"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Every compression type is accepted in ps mode (compressed pushes) as in
// ring mode, with its knobs.
func TestCompressionInPSMode(t *testing.T) {
	for _, c := range []*pb.CompressionSpec{
		{Type: "powersgd", Rank: 2, StartIter: 5},
		{Type: "topk", Ratio: 0.01},
		{Type: "int8"},
		{Type: "fp16"},
		{Type: "bf16"},
	} {
		for _, mode := range []string{"ps", "ring"} {
			s, err := Normalize(&pb.JobSpec{Mode: mode, Compression: c}, Architectures)
			if err != nil {
				t.Errorf("%s in mode %s: %v", c.Type, mode, err)
				continue
			}
			if s.GetCompression().GetType() != c.Type {
				t.Errorf("%s in mode %s: normalised to %q", c.Type, mode, s.GetCompression().GetType())
			}
		}
	}
}

// TestShardedAndAsyncPSAccepted: shards, aggregator addresses, async and
// bounded staleness are accepted in ps mode, alone and together.
func TestShardedAndAsyncPSAccepted(t *testing.T) {
	for _, ps := range []*pb.ParameterServerSpec{
		{Shards: 2},
		{Shards: 3, Consistency: "async"},
		{Shards: 2, Consistency: "bounded", Staleness: 2},
		{Consistency: "bounded"}, // staleness 0: lockstep without a barrier
		{Shards: 2, Addresses: []string{"127.0.0.1:7001", "[::1]:7002"}},
	} {
		got, err := Normalize(&pb.JobSpec{Mode: "ps", ParameterServer: ps}, nil)
		if err != nil {
			t.Errorf("%v: %v", ps, err)
			continue
		}
		if got.ParameterServer.Shards != max(ps.Shards, 1) || got.ParameterServer.Consistency != cmp.Or(ps.Consistency, "sync") {
			t.Errorf("%v normalized to %v", ps, got.ParameterServer)
		}
		if PSSharded(got) != (ps.Shards > 1 || len(ps.Addresses) > 0) {
			t.Errorf("%v: PSSharded = %v", ps, PSSharded(got))
		}
	}
}
