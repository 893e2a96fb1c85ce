package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// fedSpec is a small fedavg job: workers real clients (or, with workers 1,
// the simulation of 3 clients) over a Dirichlet split of a synthetic set.
func fedSpec(workers int32) *pb.JobSpec {
	return &pb.JobSpec{Model: "logreg", Mode: "fedavg", Workers: proto.Int32(workers), Seed: proto.Int64(3),
		Dataset:   &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 1500, SyntheticTest: 300},
		Partition: &pb.PartitionSpec{Type: "dirichlet", Alpha: 0.5},
		Federated: &pb.FederatedSpec{Rounds: 6, Clients: 3, Fraction: 1, LocalEpochs: 1, LocalBatchSize: 50, ClientLr: 0.002}}
}

// evalEvents returns a job's evaluation events, in order.
func evalEvents(evs []*pb.WatchJobResponse) []*pb.WatchJobResponse {
	var out []*pb.WatchJobResponse
	for _, ev := range evs {
		if ev.Kind == pb.EventKind_EVENT_KIND_EVAL {
			out = append(out, ev)
		}
	}
	return out
}

// runRecords reads a run's metrics.jsonl records of one kind.
func runRecords(t *testing.T, runDir, kind string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("metrics.jsonl: %v", err)
		}
		if rec["kind"] == kind {
			out = append(out, rec)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRealClientsMatchSimulation: a fedavg job on 3 workers runs 3 real
// clients over the Federation stream; with every client answering, it is
// the simulation of the same split, round for round, bit for bit (same
// sampling, local shuffles and aggregation). Accuracy improves, and the
// round records (participants, label histograms, update norms) are in
// metrics.jsonl and the summary as the simulation's are.
func TestRealClientsMatchSimulation(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	c := newCluster(t, server.Config{}, 3)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", "w2")

	realJob := c.submit(ctx, fedSpec(3))
	if j := c.waitState(ctx, realJob.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("real clients: %s", j.Message)
	}
	realEvals := evalEvents(c.watchAll(ctx, realJob.Id))
	simJob := c.submit(ctx, fedSpec(1))
	if j := c.waitState(ctx, simJob.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("simulation: %s", j.Message)
	}
	simEvals := evalEvents(c.watchAll(ctx, simJob.Id))
	if len(realEvals) != 6 || len(simEvals) != 6 {
		t.Fatalf("%d evaluations with real clients, %d simulated; want 6 each", len(realEvals), len(simEvals))
	}
	for i, r := range realEvals {
		s := simEvals[i]
		t.Logf("round %d: real %.4f (loss %.4f), simulated %.4f (loss %.4f)", r.Epoch, r.TestAccuracy, r.TestLoss, s.TestAccuracy, s.TestLoss)
		if r.Epoch != s.Epoch || math.Float64bits(r.TestAccuracy) != math.Float64bits(s.TestAccuracy) ||
			math.Float64bits(r.TestLoss) != math.Float64bits(s.TestLoss) {
			t.Errorf("evaluation %d: real clients round %d acc %v loss %v; simulation round %d acc %v loss %v",
				i, r.Epoch, r.TestAccuracy, r.TestLoss, s.Epoch, s.TestAccuracy, s.TestLoss)
		}
	}
	if first, last := realEvals[0], realEvals[5]; !(last.TestAccuracy > first.TestAccuracy && last.TestAccuracy > 0.6 && last.TestLoss < first.TestLoss) {
		t.Errorf("after round 1 accuracy %.3f, loss %.3f; after round 6 %.3f, %.3f: want both to improve, to an accuracy > 0.6",
			first.TestAccuracy, first.TestLoss, last.TestAccuracy, last.TestLoss)
	}

	rounds := runRecords(t, realJob.RunDir, "eval")
	if len(rounds) != 6 {
		t.Fatalf("%d eval records in metrics.jsonl, want 6", len(rounds))
	}
	for i, rec := range rounds {
		parts, _ := rec["participants"].([]any)
		hists, _ := rec["label_histograms"].([]any)
		norm, _ := rec["update_norm"].(float64)
		if rec["round"] != float64(i+1) || len(parts) != 3 || len(hists) != 3 || !(norm > 0) {
			t.Errorf("round record %d: %v; want round %d, 3 participants with their histograms, an update norm", i, rec, i+1)
		}
	}
	total := 0.0
	for _, h := range rounds[0]["label_histograms"].([]any) {
		for _, n := range h.([]any) {
			total += n.(float64)
		}
	}
	if total != 1500 {
		t.Errorf("the participants' label histograms hold %v examples, want the 1500 of the training split", total)
	}
	sum, err := os.ReadFile(filepath.Join(realJob.RunDir, "summary.json"))
	if err != nil || !strings.Contains(string(sum), "test_accuracy") {
		t.Errorf("summary.json: %v %s", err, sum)
	}
}

// TestRealClientSilentAndLate: one of 3 clients joins and never answers.
// Round 1 closes at its deadline with the other two (the silent one is
// missing), training goes on, and the silent client's update for round 1,
// sent once round 2 is open, is refused with Aborted and counted as late.
// Joins of an unknown job or a stale generation are refused with clear
// codes (the driver's other refusals are tested next to it, in
// federation).
func TestRealClientSilentAndLate(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	c, _, job, a := fakeClientJob(ctx, t, "silent", 2)
	fed := pb.NewFederationClient(c.conn)
	join := func(j *pb.FederationJoin) pb.Federation_ParticipateClient {
		t.Helper()
		st, err := fed.Participate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: j}}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	good := &pb.FederationJoin{JobId: a.JobId, Generation: a.Generation, Client: a.Rank, NumClients: 3, NumParams: a.NumParams}
	// The job's driver refuses wrong joins (federation's
	// TestParticipateStream); the server, joins of jobs it does not know.
	for _, tc := range []struct {
		name string
		mod  func(j *pb.FederationJoin)
		code codes.Code
		msg  string
	}{
		{"unknown job", func(j *pb.FederationJoin) { j.JobId = "job-none" }, codes.NotFound, "not found"},
		{"stale generation", func(j *pb.FederationJoin) { j.Generation-- }, codes.Aborted, "stale"},
	} {
		j := proto.Clone(good).(*pb.FederationJoin)
		tc.mod(j)
		_, err := join(j).Recv()
		wantCode(t, tc.name, err, tc.code, tc.msg)
	}

	st := join(good)
	recvModel := func(what string) *pb.RoundStart {
		t.Helper()
		var rs *pb.RoundStart
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if r := m.GetRound(); r != nil {
				rs = r
			}
			if m.GetEval() != nil {
				rs = nil // the silent client may be the evaluator: its requests wait for the next one
			}
			if f := m.GetModel(); f != nil && f.Last && rs != nil {
				return rs
			}
		}
	}
	if rs := recvModel("round 1"); rs.GetRound() != 1 || !rs.Sampled {
		t.Fatalf("first round start %v; want round 1, sampled", rs)
	}
	_, err := join(good).Recv()
	wantCode(t, "second join of a connected client", err, codes.AlreadyExists, "already connected")
	// Silent through round 1: the next round opens at its deadline.
	if rs := recvModel("round 2"); rs.GetRound() != 2 {
		t.Fatalf("round start %v; want round 2", rs)
	}
	if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: &pb.ClientUpdate{Round: 1}}}); err != nil {
		t.Fatal(err)
	}
	var sp wire.Splitter
	err = sp.Frames(&pb.TensorFrame{JobId: a.JobId, Generation: a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: 1},
		make([]float32, a.NumParams), func(f *pb.TensorFrame) error {
			return st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
		})
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = st.Recv()
	}
	wantCode(t, "update for round 1 during round 2", err, codes.Aborted, "late update", "round 1")

	j := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if j.State != pb.JobState_JOB_STATE_SUCCEEDED || !strings.Contains(j.Message, "1 late") {
		t.Fatalf("job %s: %q; want SUCCEEDED counting 1 late update", j.State, j.Message)
	}
	evals := runRecords(t, job.RunDir, "eval")
	if len(evals) != 3 {
		t.Fatalf("%d eval records, want 3", len(evals))
	}
	silent := float64(a.Rank)
	for _, rec := range evals {
		parts, _ := rec["participants"].([]any)
		missing, _ := rec["missing"].([]any)
		if len(parts) != 2 || slices.Contains(parts, any(silent)) || len(missing) != 1 || missing[0] != silent {
			t.Errorf("round %v: participants %v, missing %v; want the two real clients, client %v missing", rec["round"], parts, missing, silent)
		}
	}
	stale := runRecords(t, job.RunDir, "stale_update")
	if len(stale) != 1 || stale[0]["late"] != true || stale[0]["round"] != float64(1) {
		t.Errorf("stale update records %v; want one late update for round 1", stale)
	}
}

// fakeClientJob starts two real workers and a fake one (id), submits a
// 3-client fedavg job (3 rounds, fraction 1, min_clients 2, the round
// deadline in seconds) and returns once the fake has its assignment.
func fakeClientJob(ctx context.Context, t *testing.T, id string, deadline float64) (*cluster, *fakeWorker, *pb.Job, *pb.Assignment) {
	t.Helper()
	c := newCluster(t, server.Config{}, 2)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1")
	fake := c.connectFake(ctx, id, true)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", id)
	spec := &pb.JobSpec{Model: "logreg", Mode: "fedavg", Workers: proto.Int32(3), Seed: proto.Int64(5),
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 900, SyntheticTest: 200},
		Federated: &pb.FederatedSpec{Rounds: 3, Fraction: 1, MinClients: 2, LocalBatchSize: 30,
			RoundDeadlineSeconds: deadline}}
	job := c.submit(ctx, spec)
	var a *pb.Assignment
	for a == nil {
		a = fake.next(ctx, t).GetAssignment()
	}
	return c, fake, job, a
}

// TestParticipateRefusesOtherJobs: only a running fedavg job with real
// clients takes Participate streams.
func TestParticipateRefusesOtherJobs(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 1)
	job := c.submit(ctx, quickSpec(1))
	c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	st, err := pb.NewFederationClient(c.conn).Participate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: &pb.FederationJoin{JobId: job.Id, NumClients: 1}}}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	wantCode(t, "join of a finished ps job", err, codes.FailedPrecondition, "not a running fedavg job")
	st2, err := pb.NewFederationClient(c.conn).Participate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st2.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: &pb.ClientEval{}}}); err != nil {
		t.Fatal(err)
	}
	_, err = st2.Recv()
	wantCode(t, "no join first", err, codes.InvalidArgument, "must be a join")
}

// TestRealClientLostDoesNotHoldRounds: a client whose worker is lost
// (its coordinator stream ends) holds neither the first round's start nor
// any round until the round deadline: with a 10-minute deadline the job
// still ends within the test's minute, every round closed by the last
// answer of the two clients left, the lost one missing.
func TestRealClientLostDoesNotHoldRounds(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c, fake, job, a := fakeClientJob(ctx, t, "doomed", 600)
	fake.stop() // gone before it ever joins the rounds

	j := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %s: %q; want SUCCEEDED on the two clients left", j.State, j.Message)
	}
	lost := float64(a.Rank)
	for _, rec := range runRecords(t, job.RunDir, "progress") {
		if rec["at_deadline"] == true {
			t.Errorf("round %v closed at its deadline; want it closed by the last answer", rec["step"])
		}
		missing, _ := rec["missing"].([]any)
		if len(missing) != 1 || missing[0] != lost {
			t.Errorf("round %v: missing %v; want client %v", rec["step"], missing, lost)
		}
	}
	if lostRecs := runRecords(t, job.RunDir, "client_lost"); len(lostRecs) != 1 || lostRecs[0]["client"] != lost {
		t.Errorf("client_lost records %v; want one for client %v", lostRecs, lost)
	}
}
