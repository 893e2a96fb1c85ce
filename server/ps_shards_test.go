package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// shardSpec trains logreg on the synthetic set with 2 workers in ps mode
// (31 steps), on k shards with the given consistency.
func shardSpec(k int32, consistency string, staleness int32) *pb.JobSpec {
	s := quickSpec(2)
	s.Mode = "ps"
	s.Seed = proto.Int64(4)
	s.Epochs = proto.Int32(1)
	s.ParameterServer = &pb.ParameterServerSpec{Shards: k, Consistency: consistency, Staleness: staleness}
	return s
}

// runToEnd submits spec and waits for it to succeed.
func (c *cluster) runToEnd(ctx context.Context, t *testing.T, spec *pb.JobSpec) *pb.Job {
	t.Helper()
	job := c.submit(ctx, spec)
	j := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %s (shards %d, %s): %s", job.Id, spec.GetParameterServer().GetShards(), spec.GetParameterServer().GetConsistency(), j.Message)
	}
	return j
}

// startAggregators starts n `gradsync aggregator` servers on loopback TCP
// and returns their addresses; they stop when the test ends (stop stops
// one earlier).
func startAggregators(t *testing.T, n int) (addrs []string, stop []func()) {
	t.Helper()
	for range n {
		a, err := paramserver.NewShardServer(paramserver.ShardServerConfig{Insecure: true, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Serve(ctx, lis) }() // owned by the test: stop waits for it
		stopped := false
		stopFn := func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("aggregator Serve: %v", err)
			}
			if n := a.Jobs(); n != 0 {
				t.Errorf("aggregator still holds %d job shard(s) after it stopped", n)
			}
		}
		t.Cleanup(stopFn)
		addrs, stop = append(addrs, lis.Addr().String()), append(stop, stopFn)
	}
	return addrs, stop
}

// TestPSShardsMatchOneShard: with consistency sync, K shards (in the
// server, or in aggregator processes) end with the parameters of one
// shard, bit for bit, and the same accuracy.
func TestPSShardsMatchOneShard(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	c := newCluster(t, server.Config{}, 2)
	one := c.runToEnd(ctx, t, shardSpec(1, "", 0)).GetResult()
	if one.GetParameterChecksum() == 0 || one.GetTestAccuracy() < 0.8 {
		t.Fatalf("one shard: checksum %x, accuracy %.3f", one.GetParameterChecksum(), one.GetTestAccuracy())
	}
	addrs, _ := startAggregators(t, 2)
	external := shardSpec(2, "", 0)
	external.ParameterServer.Addresses = addrs
	for name, spec := range map[string]*pb.JobSpec{
		"2 shards": shardSpec(2, "", 0), "3 shards": shardSpec(3, "", 0), "2 aggregators": external,
	} {
		r := c.runToEnd(ctx, t, spec).GetResult()
		t.Logf("%s: accuracy %.4f, checksum %x (one shard: %x)", name, r.GetTestAccuracy(), r.GetParameterChecksum(), one.GetParameterChecksum())
		if r.GetParameterChecksum() != one.GetParameterChecksum() || r.GetTestAccuracy() != one.GetTestAccuracy() || r.GetSteps() != one.GetSteps() {
			t.Errorf("%s: checksum %x, accuracy %v after %d steps; one shard: %x, %v after %d", name, r.GetParameterChecksum(), r.GetTestAccuracy(),
				r.GetSteps(), one.GetParameterChecksum(), one.GetTestAccuracy(), one.GetSteps())
		}
	}
}

// TestPSAsyncAndBoundedTrain: async and bounded-staleness jobs (one rank
// slowed down) train to the synchronous accuracy; a bounded job's
// gradients are never more than staleness steps stale and the fast rank
// waits; the figures reach the result and metrics.jsonl.
func TestPSAsyncAndBoundedTrain(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.stepDelay = map[string]time.Duration{"slow": 5 * time.Millisecond}
	c.addWorker("fast")
	c.addWorker("slow")
	for _, tc := range []struct {
		k           int32
		consistency string
		staleness   int32
	}{{2, "async", 0}, {2, "bounded", 1}, {1, "bounded", 0}, {3, "bounded", 3}} {
		j := c.runToEnd(ctx, t, shardSpec(tc.k, tc.consistency, tc.staleness))
		r := j.GetResult()
		t.Logf("%d shard(s) %s s=%d: accuracy %.4f; rank 0 staleness mean %.2f max %d steps, mean %.2f max %d updates; waited %.3fs; refused %d",
			tc.k, tc.consistency, tc.staleness, r.GetTestAccuracy(), r.GetPsStaleStepsMean(), r.GetPsStaleStepsMax(),
			r.GetPsStaleUpdatesMean(), r.GetPsStaleUpdatesMax(), r.GetPsWaitSeconds(), r.GetPsRefused())
		if r.GetTestAccuracy() < 0.8 {
			t.Errorf("%s: accuracy %.3f", tc.consistency, r.GetTestAccuracy())
		}
		if tc.consistency == "bounded" && r.GetPsStaleStepsMax() > int64(tc.staleness) {
			t.Errorf("bounded s=%d: a gradient %d steps stale was applied", tc.staleness, r.GetPsStaleStepsMax())
		}
		if r.GetPsRefused() != 0 {
			t.Errorf("%s: %d gradients refused; the wait keeps them within the bound", tc.consistency, r.GetPsRefused())
		}
		// Only async is sure to show staleness: there the fast rank races
		// ahead of the slowed one, so nearly every gradient of the slowed
		// rank (5 ms per step) is stale. The result holds rank 0's figures
		// only, and rank 0 may be the fast one, whose short steps can all
		// miss the slow rank's pushes on a loaded machine; metrics.jsonl
		// has every rank's. A bounded rank 0 may be the fast one and, at
		// s = 0, run in lockstep, its pushes always first (0 is then right).
		seen, maxStale := stalenessRecords(t, j.RunDir)
		if tc.consistency == "async" && r.GetPsStaleUpdatesMean() == 0 && maxStale == 0 {
			t.Errorf("%s with 2 ranks: no gradient of either rank was stale by a single update", tc.consistency)
		}
		if !seen {
			t.Errorf("%s: metrics.jsonl has no progress record with ps_stale_updates_max", tc.consistency)
		}
	}
}

// stalenessRecords reports whether a run's metrics.jsonl holds a progress
// record with the staleness figures, and the largest ps_stale_updates_max
// over all of them (every rank's).
func stalenessRecords(t *testing.T, runDir string) (seen bool, maxUpdates float64) {
	t.Helper()
	f, err := os.Open(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["kind"] == "progress" {
			if v, ok := rec["ps_stale_updates_max"]; ok {
				seen = true
				if x, ok := v.(float64); ok {
					maxUpdates = max(maxUpdates, x)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return seen, maxUpdates
}

// rankGrad is a whole-tensor gradient frame of rank's for step.
func rankGrad(a *pb.Assignment, rank int32, step int64, v float32) *pb.TensorFrame {
	f := gradFrame(a, step, v)
	f.Rank = rank
	return f
}

// recvAnswer reads the parameters for step and returns the receipt.
func recvAnswer(t *testing.T, stream pb.ParameterServer_SyncClient, n, step int64) *pb.PushReceipt {
	t.Helper()
	var rc *pb.PushReceipt
	got := int64(0)
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for the parameters of step %d: %v", step, err)
		}
		if m.Receipt != nil {
			rc = m.Receipt
		}
		f := m.GetParameters()
		if f.GetStep() != step {
			t.Fatalf("parameters of step %d, want %d", f.GetStep(), step)
		}
		got += int64(len(f.Data) / 4)
		if f.Last {
			if got != n {
				t.Fatalf("%d parameters, want %d", got, n)
			}
			return rc
		}
	}
}

// TestPSBoundedStalenessWaits drives a bounded (s=1) job's parameter
// server by hand with two ranks: the fast one gets the parameters for
// steps 1 (one ahead) at once, for step 2 only once the slow one pushed
// step 0, and when it would be two ahead for the step timeout the job's
// shard fails with DeadlineExceeded naming the slow rank; the slow rank's
// stream is aborted.
func TestPSBoundedStalenessWaits(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{HeartbeatTimeout: time.Minute}, 0)
	fakes := []*fakeWorker{c.connectFake(ctx, "fake-a", true), c.connectFake(ctx, "fake-b", true)}
	spec := longSpec(2)
	spec.Mode = "ps"
	spec.StepTimeoutSeconds = 1
	spec.ParameterServer = &pb.ParameterServerSpec{Consistency: "bounded", Staleness: 1}
	job := c.submit(ctx, spec)
	var as [2]*pb.Assignment
	for _, f := range fakes {
		for {
			if a := f.next(ctx, t).GetAssignment(); a != nil && a.JobId == job.Id {
				as[a.Rank] = a
				break
			}
		}
	}
	n := as[0].NumParams
	var streams [2]pb.ParameterServer_SyncClient
	for r, a := range as {
		s, err := c.ps.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		j := goodJoin(a)
		j.Rank = int32(r)
		if err := s.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: j}}); err != nil {
			t.Fatal(err)
		}
		if rc := recvAnswer(t, s, n, 0); rc != nil {
			t.Fatalf("rank %d: a receipt before any push: %v", r, rc)
		}
		streams[r] = s
	}
	push := func(r int32, step int64) {
		t.Helper()
		if err := streams[r].Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: rankGrad(as[r], r, step, 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	push(0, 0)
	if rc := recvAnswer(t, streams[0], n, 1); rc == nil || !rc.Applied || rc.StaleSteps != 0 {
		t.Fatalf("rank 0 step 0: receipt %v", rc)
	}
	push(0, 1) // rank 0 would read for step 2 while rank 1 is at 0: it waits
	push(1, 0)
	if rc := recvAnswer(t, streams[1], n, 1); rc == nil || !rc.Applied || rc.StaleUpdates < 1 {
		t.Fatalf("rank 1 step 0: receipt %v; want it applied after rank 0's first update", rc)
	}
	if rc := recvAnswer(t, streams[0], n, 2); rc == nil || rc.StaleSteps > 1 {
		t.Fatalf("rank 0 step 1: receipt %v", rc)
	}
	push(0, 2) // two ahead of rank 1 (at step 1) for good
	// The shard's own bound ends the wait (the test's context is far
	// longer): DeadlineExceeded from the shard, naming the rank behind.
	_, err := streams[0].Recv()
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "rank(s) [1]") {
		t.Fatalf("rank 0 two steps ahead: %v; want DeadlineExceeded naming rank 1", err)
	}
	push(1, 1)
	if _, err := streams[1].Recv(); status.Code(err) != codes.Aborted {
		t.Fatalf("rank 1 after the shard failed: %v; want Aborted", err)
	}
	for _, s := range streams {
		_ = s.CloseSend()
	}
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: job.Id}); err != nil {
		t.Fatal(err)
	}
}

// TestPSShardJoinRefusals: a join must name a shard of the job's.
func TestPSShardJoinRefusals(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := newCluster(t, server.Config{HeartbeatTimeout: time.Minute}, 0)
	f := c.connectFake(ctx, "fake-ps", true)
	spec := longSpec(1)
	spec.Mode = "ps"
	spec.ParameterServer = &pb.ParameterServerSpec{Shards: 2}
	job := c.submit(ctx, spec)
	var a *pb.Assignment
	for a == nil {
		a = f.next(ctx, t).GetAssignment()
	}
	for name, tc := range map[string]struct {
		shard, of int32
		code      codes.Code
	}{
		"shard 2 of 2": {2, 2, codes.InvalidArgument}, "shard -1": {-1, 2, codes.InvalidArgument},
		"one shard assumed": {0, 1, codes.InvalidArgument}, "three assumed": {1, 3, codes.InvalidArgument},
	} {
		s, err := c.ps.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		j := goodJoin(a)
		j.Shard, j.NumShards = tc.shard, tc.of
		if err := s.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: j}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if _, err := s.Recv(); status.Code(err) != tc.code {
			t.Errorf("%s: %v; want %v", name, err, tc.code)
		}
	}
	// Shard 1 of 2 holds the second half of the parameters.
	s, err := c.ps.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	j := goodJoin(a)
	j.Shard, j.NumShards = 1, 2
	if err := s.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: j}}); err != nil {
		t.Fatal(err)
	}
	if _, err := recvParams(s, a.NumParams/2, 0); err != nil {
		t.Fatalf("shard 1 of 2: %v", err)
	}
	_ = s.CloseSend()
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: job.Id}); err != nil {
		t.Fatal(err)
	}
}

// TestPSAggregatorDies: when one of a job's aggregator processes stops
// mid-training, every rank's step fails naming that shard, and the job
// fails from the broken stream, not by its step timeout running out;
// nothing is left running.
func TestPSAggregatorDies(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	c := newCluster(t, server.Config{}, 2)
	addrs, stop := startAggregators(t, 2)
	spec := longSpec(2)
	spec.Mode = "ps"
	spec.StepTimeoutSeconds = 30
	spec.ParameterServer = &pb.ParameterServerSpec{Shards: 2, Addresses: addrs}
	job := c.submit(ctx, spec)
	c.waitProgress(ctx, job.Id, func(p *pb.Progress) bool { return p.Step >= 4 })
	stop[1]()
	j := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_FAILED, pb.JobState_JOB_STATE_SUCCEEDED)
	if j.State != pb.JobState_JOB_STATE_FAILED || !strings.Contains(j.Message, "shard 1 of 2 (aggregator "+addrs[1]+")") {
		t.Fatalf("job %v: %q; want FAILED naming shard 1's aggregator", j.State, j.Message)
	}
	// The broken stream failed the step, not the step timeout (30 s)
	// running out while the rank waited for an answer.
	if strings.Contains(j.Message, "step timeout") {
		t.Fatalf("job failed by its step timeout: %q; want the shard's broken stream", j.Message)
	}
	t.Logf("failed after the aggregator stopped: %s", j.Message)
}

// TestAggregatorJoinRefusals: an aggregator serves only joins that carry
// a ps spec naming aggregators, for a shard of it, with the spec's world,
// and the same spec from every rank; once every stream to a shard has
// closed, the shard is gone and a late join is refused.
func TestAggregatorJoinRefusals(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	addrs, _ := startAggregators(t, 1)
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps := pb.NewParameterServerClient(conn)
	spec := func(mod func(*pb.JobSpec)) *pb.JobSpec {
		s := longSpec(2)
		s.Mode = "ps"
		s.ParameterServer = &pb.ParameterServerSpec{Shards: 2, Addresses: []string{addrs[0], addrs[0]}}
		if mod != nil {
			mod(s)
		}
		return s
	}
	const n = 7850 // logreg
	join := func(rank int32, sp *pb.JobSpec, mod func(*pb.SyncJoin)) (pb.ParameterServer_SyncClient, error) {
		t.Helper()
		s, err := ps.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		j := &pb.SyncJoin{JobId: "job-agg", Generation: 1, Rank: rank, WorldSize: 2, NumParams: n, TotalSteps: 10,
			Shard: 1, NumShards: 2, Spec: sp}
		if mod != nil {
			mod(j)
		}
		if err := s.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: j}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_, err = recvParams(s, n/2, 0)
		return s, err
	}
	for name, tc := range map[string]struct {
		spec *pb.JobSpec
		mod  func(*pb.SyncJoin)
	}{
		"no spec":              {nil, nil},
		"shards in the server": {spec(func(s *pb.JobSpec) { s.ParameterServer.Addresses = nil }), nil},
		"ring mode":            {spec(func(s *pb.JobSpec) { s.Mode = "ring" }), nil},
		"bad spec":             {spec(func(s *pb.JobSpec) { s.BatchSize = proto.Int32(-1) }), nil},
		"shard 2 of 2":         {spec(nil), func(j *pb.SyncJoin) { j.Shard = 2 }},
		"3 shards assumed":     {spec(nil), func(j *pb.SyncJoin) { j.NumShards = 3 }},
		"world 1000":           {spec(nil), func(j *pb.SyncJoin) { j.WorldSize = 1000 }},
		"other model size":     {spec(nil), func(j *pb.SyncJoin) { j.NumParams = n + 1 }},
	} {
		if _, err := join(0, tc.spec, tc.mod); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v; want InvalidArgument", name, err)
		}
	}
	s0, err := join(0, spec(nil), nil)
	if err != nil {
		t.Fatalf("rank 0: %v", err)
	}
	if _, err := join(1, spec(func(s *pb.JobSpec) { s.Seed = proto.Int64(99) }), nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("rank 1 with another spec: %v; want InvalidArgument", err)
	}
	if err := s0.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s0.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("rank 0 after closing: %v; want the stream to end cleanly", err)
	}
	if _, err := join(1, spec(nil), nil); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a join after every stream closed: %v; want FailedPrecondition", err)
	}
}
