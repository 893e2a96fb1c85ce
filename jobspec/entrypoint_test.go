package jobspec

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestEntrypoint(t *testing.T) {
	ok := func() *pb.JobSpec {
		return &pb.JobSpec{Workers: proto.Int32(2), Entrypoint: &pb.EntrypointSpec{Command: []string{"python3", "train.py"}, Env: map[string]string{"OMP_NUM_THREADS": "1"}}}
	}
	s, err := Normalize(ok(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "ring" || !IsEntrypoint(s) {
		t.Fatalf("mode %q: entrypoint jobs default to ring", s.Mode)
	}
	if got := s.GetCollective().GetTransport(); got != "auto" {
		t.Fatalf("transport %q: a script's ring defaults to auto (shared memory on one host)", got)
	}
	g := ok()
	g.Collective = &pb.CollectiveSpec{Transport: "grpc"}
	if s, err := Normalize(g, nil); err != nil || s.GetCollective().GetTransport() != "grpc" {
		t.Fatalf("transport grpc asked for: %v %v", s.GetCollective(), err)
	}
	// Every compression type applies to a script's gradient buckets.
	for _, typ := range []string{"powersgd", "topk", "int8", "fp16", "bf16"} {
		s := ok()
		s.Compression = &pb.CompressionSpec{Type: typ}
		if _, err := Normalize(s, nil); err != nil {
			t.Errorf("compression %s: %v", typ, err)
		}
	}
	// Mode ps: the coordinator's shards sum the script's calls, with one
	// shard or several, or `gradsync aggregator` processes'.
	for _, psSpec := range []*pb.ParameterServerSpec{{Shards: 1}, {Shards: 3}, {Shards: 2, Addresses: []string{"a:1", "b:1"}}} {
		p := ok()
		p.Mode = "ps"
		p.ParameterServer = psSpec
		if s, err := Normalize(p, nil); err != nil || s.Mode != "ps" {
			t.Errorf("mode ps, %v: %v", psSpec, err)
		}
	}
	// A federated client per worker (gradsync.fl), with the server
	// optimisers and weighting by examples.
	fed := ok()
	fed.Mode, fed.Federated = "fedavg", &pb.FederatedSpec{Rounds: 3, Fraction: 1, Strategy: "fedavgm"}
	if s, err := Normalize(fed, nil); err != nil || s.Federated.Clients != 2 || s.Federated.Weighting != "examples" {
		t.Errorf("fedavg entrypoint on 2 workers: %v, %v; want 2 clients weighted by examples", s.GetFederated(), err)
	}
	// Elastic: its commands restart on a new generation.
	el := ok()
	el.MinWorkers = 1
	if _, err := Normalize(el, nil); err != nil {
		t.Errorf("min_workers 1: %v", err)
	}
	for _, c := range []struct {
		edit  func(*pb.JobSpec)
		field string
		msg   string
	}{
		{func(s *pb.JobSpec) { s.Entrypoint.Command = nil }, "entrypoint.command", "is empty"},
		{func(s *pb.JobSpec) { s.Entrypoint.Command = []string{""} }, "entrypoint.command", "is empty"},
		{func(s *pb.JobSpec) { s.Entrypoint.Env["GRADSYNC_TOKEN"] = "x" }, "entrypoint.env", "GRADSYNC_"},
		{func(s *pb.JobSpec) { s.Entrypoint.Env["RANK"] = "3" }, "entrypoint.env", "set by the worker"},
		{func(s *pb.JobSpec) { s.Entrypoint.Env["A=B"] = "3" }, "entrypoint.env", "not a variable name"},
		{func(s *pb.JobSpec) { s.Mode = "ps"; s.Compression = &pb.CompressionSpec{Type: "powersgd"} }, "compression.type", "only sum"},
		{func(s *pb.JobSpec) {
			s.Mode = "ps"
			s.ParameterServer = &pb.ParameterServerSpec{Consistency: PSAsync}
		}, "parameter_server.consistency", "sync"},
		{func(s *pb.JobSpec) { s.Mode = "ps"; s.MinWorkers = 1 }, "min_workers", notImplementedSuffix},
		{func(s *pb.JobSpec) { s.Compression = &pb.CompressionSpec{Type: "zip"} }, "compression", "allowed"},
		{func(s *pb.JobSpec) { s.Checkpoint = &pb.CheckpointSpec{EverySteps: 10} }, "checkpoint", notImplementedSuffix},
		// fedavg: one script client per worker, and nothing that needs
		// the clients' label histograms or the worker's own data.
		{func(s *pb.JobSpec) { s.Mode, s.Workers = "fedavg", proto.Int32(1) }, "workers", "one client (script) per worker"},
		{func(s *pb.JobSpec) { s.Mode, s.Partition = "fedavg", &pb.PartitionSpec{Type: "dirichlet"} }, "partition", "load their own data"},
		{func(s *pb.JobSpec) {
			s.Mode, s.Federated = "fedavg", &pb.FederatedSpec{Reweighting: "class-balanced"}
		}, "federated.reweighting", "label histogram"},
		{func(s *pb.JobSpec) {
			s.Mode, s.Federated = "fedavg", &pb.FederatedSpec{Weighting: "label-balanced"}
		}, "federated.weighting", "label histogram"},
		{func(s *pb.JobSpec) {
			s.Mode, s.Checkpoint = "fedavg", &pb.CheckpointSpec{EverySteps: 1}
		}, "checkpoint", notImplementedSuffix},
	} {
		s := ok()
		c.edit(s)
		_, err := Normalize(s, nil)
		fe, isFE := err.(*FieldError)
		if !isFE || fe.Field != c.field || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%s: got %v, want a %s error containing %q", c.field, err, c.field, c.msg)
		}
	}
}
