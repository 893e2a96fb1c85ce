package federation

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// These tests drive a Driver as scripts: a fake clock, fake sessions
// (their outboxes read directly) and a fake coordinator that records what
// it is asked and, like the server's, calls back into the driver under
// its own lock when it ends the job. Nothing runs Run unless the test
// says so: each step makes the driver's queued Coordinator calls itself
// (flush), so what the coordinator heard is known after every step.

// fakeCoord is a Coordinator that records its calls.
type fakeCoord struct {
	mu     sync.Mutex // as the coordinator's lock: held while it calls the driver
	d      *Driver
	now    func() time.Time
	events []Event
	logs   []map[string]any
	ends   int
	state  pb.JobState
	msg    string
	result *pb.JobResult
	saved  string        // the checkpoint written as the job stopped, if any
	ended  chan struct{} // closed by the first End
}

func (f *fakeCoord) Emit(ev Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, ev)
}

func (f *fakeCoord) Log(rec map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, rec)
}

// End ends the job as the server's endJobLocked does: under its lock it
// aborts the driver and, unless the job succeeded, has it write its
// checkpoint.
func (f *fakeCoord) End(state pb.JobState, msg string, result *pb.JobResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends++
	if f.ends > 1 {
		return
	}
	f.state, f.msg, f.result = state, msg, result
	f.d.Abort(errors.New(msg))
	if state != pb.JobState_JOB_STATE_SUCCEEDED {
		path, err := f.d.SaveStopped(f.now())
		if err != nil {
			panic(err)
		}
		f.saved = path
	}
	close(f.ended)
}

// logsOf returns the run-log records of one kind.
func (f *fakeCoord) logsOf(kind string) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for _, r := range f.logs {
		if r["kind"] == kind {
			out = append(out, r)
		}
	}
	return out
}

// eventsOf returns the events of one kind.
func (f *fakeCoord) eventsOf(kind pb.EventKind) []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Event
	for _, ev := range f.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// harness is one job's driver with n fake clients.
type harness struct {
	t     *testing.T
	d     *Driver
	coord *fakeCoord
	now   time.Time
	ids   []string
}

const testDeadline = 10 * time.Second

// testSpec is a 3-round fedavg job of n clients, all sampled, with
// min_clients and a 10 s round deadline.
func testSpec(minClients int32) *pb.JobSpec {
	return &pb.JobSpec{Model: "logreg", Mode: "fedavg", Workers: proto.Int32(3), Seed: proto.Int64(5),
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 90, SyntheticTest: 30},
		Federated: &pb.FederatedSpec{Rounds: 3, Fraction: 1, MinClients: minClients, LocalBatchSize: 30, ClientLr: 0.01,
			ServerLr: 1, RoundDeadlineSeconds: testDeadline.Seconds()}}
}

func newHarness(t *testing.T, spec *pb.JobSpec, ckptDir string) *harness {
	t.Helper()
	return resumeHarness(t, spec, ckptDir, "")
}

// resumeHarness is newHarness for a job that resumes from a checkpoint.
func resumeHarness(t *testing.T, spec *pb.JobSpec, ckptDir, resumeFrom string) *harness {
	t.Helper()
	net, err := models.New("logreg", models.Options{Channels: 1, Height: 28, Width: 28, Classes: 10, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), ids: []string{"w0", "w1", "w2"}}
	h.coord = &fakeCoord{now: h.clock, ended: make(chan struct{})}
	h.d, err = New(Config{JobID: "job-1", Generation: 1, Spec: spec, WorkerIDs: h.ids, Net: net,
		CheckpointDir: ckptDir, ResumeFrom: resumeFrom, Started: h.now, Now: h.clock, Logger: slog.New(slog.DiscardHandler)}, h.coord)
	if err != nil {
		t.Fatal(err)
	}
	h.coord.d = h.d
	return h
}

func (h *harness) clock() time.Time { return h.now }

// advance moves the clock on by dt and lets the driver handle the time.
func (h *harness) advance(dt time.Duration) {
	h.now = h.now.Add(dt)
	h.d.tick()
	h.d.flush()
}

// join connects client k.
func (h *harness) join(k int) *session {
	h.t.Helper()
	c := &session{client: k, out: make(chan message, fedOutbox), stop: func() { h.t.Errorf("client %d dropped", k) }}
	h.d.mu.Lock()
	err := h.d.joinLocked(c, nil)
	h.d.mu.Unlock()
	h.d.flush()
	if err != nil {
		h.t.Fatalf("join of client %d: %v", k, err)
	}
	return c
}

// update sends client k's (zero) update for round.
func (h *harness) update(k, round int) error {
	err := h.submit(k, round)
	h.d.flush()
	return err
}

// submit is update without the flush (for a driver whose Run flushes).
func (h *harness) submit(k, round int) error {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	return h.d.updateLocked(h.d.sessions[k], federated.Update{Client: k, Round: round,
		Delta: make([]float32, h.d.params), NumExamples: 30, TrainLoss: 1})
}

// eval answers the evaluation of round from client k.
func (h *harness) eval(k, round int) error {
	h.d.mu.Lock()
	err := h.d.evalLocked(h.d.sessions[k], &pb.ClientEval{Round: int32(round), TestAccuracy: 0.5, TestLoss: 1})
	h.d.mu.Unlock()
	h.d.flush()
	return err
}

// lose tells the driver that client k's worker is lost, under the
// coordinator's lock as the server does.
func (h *harness) lose(k int) {
	h.coord.mu.Lock()
	h.d.WorkerLost(h.ids[k], "heartbeats stopped")
	h.coord.mu.Unlock()
	h.d.flush()
}

// rounds returns the rounds client c has been told of since last asked,
// and whether it got the model for each.
func rounds(c *session) (started []int32, sampled []bool) {
	for {
		select {
		case m := <-c.out:
			if r := m.resp.GetRound(); r != nil {
				started = append(started, r.Round)
				sampled = append(sampled, r.Sampled && m.model != nil)
			}
		default:
			return started, sampled
		}
	}
}

// TestFirstRoundWaitsForEveryClient: the first round opens once every
// client has joined, or at the start deadline with those that have.
func TestFirstRoundWaitsForEveryClient(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	c0, c1 := h.join(0), h.join(1)
	h.advance(testDeadline / 2)
	if r, _ := rounds(c0); len(r) != 0 {
		t.Fatalf("rounds %v opened with 2 of 3 clients in, before the start deadline", r)
	}
	c2 := h.join(2)
	for k, c := range []*session{c0, c1, c2} {
		if r, s := rounds(c); !slices.Equal(r, []int32{1}) || !s[0] {
			t.Errorf("client %d: rounds %v, with the model %v; want round 1, sampled", k, r, s)
		}
	}

	h = newHarness(t, testSpec(2), "")
	c0 = h.join(0)
	h.join(1)
	h.advance(testDeadline - time.Nanosecond)
	if r, _ := rounds(c0); len(r) != 0 {
		t.Fatalf("rounds %v opened before the start deadline", r)
	}
	h.advance(time.Nanosecond)
	if r, _ := rounds(c0); !slices.Equal(r, []int32{1}) {
		t.Fatalf("at the start deadline: rounds %v, want round 1 with the clients in", r)
	}
}

// TestLateUpdateRefusedAborted: a sampled client silent through round 1
// is missing when it closes at its deadline; its update for round 1,
// during round 2, is refused with Aborted and logged as late.
func TestLateUpdateRefusedAborted(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	h.join(0)
	h.join(1)
	c2 := h.join(2)
	for k := range 2 {
		if err := h.update(k, 1); err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
	}
	if p := h.coord.logsOf("progress"); len(p) != 0 {
		t.Fatalf("round 1 closed before its deadline with client 2 silent: %v", p)
	}
	rounds(c2)
	h.advance(testDeadline)
	p := h.coord.logsOf("progress")
	if len(p) != 1 || p[0]["at_deadline"] != true || !slices.Equal(p[0]["missing"].([]int), []int{2}) {
		t.Fatalf("progress records %v; want round 1 closed at its deadline, client 2 missing", p)
	}
	if r, _ := rounds(c2); !slices.Equal(r, []int32{2}) {
		t.Fatalf("client 2 told of rounds %v, want round 2", r)
	}
	err := h.update(2, 1)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "late") {
		t.Fatalf("update for round 1 during round 2: %v; want Aborted, late", err)
	}
	if s := h.coord.logsOf("stale_update"); len(s) != 1 || s[0]["late"] != true || s[0]["round"] != 1 {
		t.Errorf("stale update records %v; want one late update for round 1", s)
	}
	if h.coord.ends != 0 {
		t.Errorf("the job ended (%s: %s) on a late update", h.coord.state, h.coord.msg)
	}
}

// TestLostClientDoesNotHoldRound: a sampled client whose worker is lost
// is missing from the open round, which closes with the others' last
// answer, not at its deadline; one lost before it joined does not hold
// the first round's start.
func TestLostClientDoesNotHoldRound(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	c0 := h.join(0)
	h.join(1)
	h.join(2)
	h.lose(2)
	if lost := h.coord.logsOf("client_lost"); len(lost) != 1 || lost[0]["client"] != 2 || lost[0]["worker"] != "w2" {
		t.Errorf("client_lost records %v; want client 2 (w2)", lost)
	}
	if evs := h.coord.eventsOf(pb.EventKind_EVENT_KIND_LOG); len(evs) != 1 || !strings.Contains(evs[0].Message, "worker w2 (client 2) lost") {
		t.Errorf("log events %v; want worker w2's loss", evs)
	}
	rounds(c0)
	for k := range 2 {
		if err := h.update(k, 1); err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
	}
	p := h.coord.logsOf("progress")
	if len(p) != 1 || p[0]["at_deadline"] != false || !slices.Equal(p[0]["missing"].([]int), []int{2}) {
		t.Fatalf("progress records %v; want round 1 closed by the last answer, client 2 missing", p)
	}
	if r, _ := rounds(c0); !slices.Equal(r, []int32{2}) {
		t.Errorf("rounds %v after round 1 closed; want round 2 open at once", r)
	}

	h = newHarness(t, testSpec(2), "")
	c0 = h.join(0)
	h.join(1)
	h.lose(2)
	if r, _ := rounds(c0); !slices.Equal(r, []int32{1}) {
		t.Errorf("rounds %v with clients 0 and 1 in and client 2 lost; want round 1 open before the start deadline", r)
	}
}

// TestEveryClientLostFailsJob: the job fails only when its last client
// is lost.
func TestEveryClientLostFailsJob(t *testing.T) {
	h := newHarness(t, testSpec(1), "")
	h.join(0)
	h.lose(0)
	h.lose(1)
	if h.coord.ends != 0 {
		t.Fatalf("ended with one client left: %s", h.coord.msg)
	}
	h.lose(2)
	if h.coord.state != pb.JobState_JOB_STATE_FAILED || !strings.Contains(h.coord.msg, "every client is lost") {
		t.Fatalf("job %s: %q; want FAILED, every client lost", h.coord.state, h.coord.msg)
	}
}

// TestRoundFailsBelowMinClients: a round with fewer answers than
// min_clients at its deadline fails, and so does the job.
func TestRoundFailsBelowMinClients(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	for k := range 3 {
		h.join(k)
	}
	if err := h.update(0, 1); err != nil {
		t.Fatal(err)
	}
	h.advance(testDeadline)
	if h.coord.ends != 1 || h.coord.state != pb.JobState_JOB_STATE_FAILED || !strings.Contains(h.coord.msg, "round 1") {
		t.Fatalf("%d end(s), job %s: %q; want FAILED naming round 1", h.coord.ends, h.coord.state, h.coord.msg)
	}
	if rf := h.coord.logsOf("round_failed"); len(rf) != 1 || rf[0]["round"] != 1 {
		t.Errorf("round_failed records %v; want round 1", rf)
	}
	if err := h.update(1, 1); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("update after the job failed: %v; want FailedPrecondition", err)
	}
}

// TestSuccessAfterFinalEvaluation: every round closed and evaluated by
// client 0 (the evaluator), the job ends SUCCEEDED with the last
// evaluation and the global model's checksum; the clients are told so.
func TestSuccessAfterFinalEvaluation(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	for k := range 3 {
		h.join(k)
	}
	for round := 1; round <= 3; round++ {
		for k := range 3 {
			if err := h.update(k, round); err != nil {
				t.Fatalf("round %d, client %d: %v", round, k, err)
			}
		}
		if err := h.eval(1, round); status.Code(err) != codes.InvalidArgument {
			t.Errorf("round %d evaluated by client 1, not asked: %v; want InvalidArgument", round, err)
		}
		if err := h.eval(0, round); err != nil {
			t.Fatalf("evaluation of round %d: %v", round, err)
		}
	}
	if evs := h.coord.eventsOf(pb.EventKind_EVENT_KIND_EVAL); len(evs) != 3 || evs[2].Eval.GetRound().GetRound() != 3 {
		t.Errorf("%d evaluation events; want 3, the last of round 3", len(evs))
	}
	r := h.coord.result
	if h.coord.state != pb.JobState_JOB_STATE_SUCCEEDED || r.GetSteps() != 3 || r.GetTestAccuracy() != 0.5 ||
		r.GetParameterChecksum() != models.Checksum(h.d.srv.Global()) {
		t.Fatalf("job %s: %q, result %v; want SUCCEEDED after 3 rounds with the last evaluation and the model's checksum", h.coord.state, h.coord.msg, r)
	}
	if h.d.doneMsg != h.coord.msg {
		t.Errorf("clients are told %q, the job ended with %q", h.d.doneMsg, h.coord.msg)
	}
}

// TestCoordinatorCallsBackUnderItsLock: with Run going, a coordinator
// that calls the driver under its own lock (the loss of every client, as
// the server's heartbeat monitor reports it) and, in End, aborts it and
// has it write its checkpoint under that lock too, does not deadlock, and
// Run returns once aborted.
func TestCoordinatorCallsBackUnderItsLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := testSpec(1)
	spec.Checkpoint = &pb.CheckpointSpec{EverySteps: 100}
	h := newHarness(t, spec, t.TempDir())
	ran := make(chan struct{})
	go func() { // owned by the test: ends once the driver is aborted
		defer close(ran)
		h.d.Run()
	}()
	for k := range 3 {
		h.d.mu.Lock()
		err := h.d.joinLocked(&session{client: k, out: make(chan message, fedOutbox), stop: func() {}}, nil)
		h.d.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := h.submit(0, 1); err != nil { // round 1 closes as the others are lost: there is state to save
		t.Fatal(err)
	}
	for _, k := range []int{1, 2, 0} {
		h.coord.mu.Lock()
		h.d.WorkerLost(h.ids[k], "heartbeats stopped")
		h.coord.mu.Unlock()
	}
	select {
	case <-h.coord.ended:
	case <-ctx.Done():
		t.Fatal("the job never ended")
	}
	select {
	case <-ran:
	case <-ctx.Done():
		t.Fatal("Run did not return after the abort")
	}
	if h.coord.state != pb.JobState_JOB_STATE_FAILED || !strings.HasSuffix(h.coord.saved, "ckpt-1") {
		t.Errorf("job %s: %q, checkpoint at stop %q; want FAILED with ckpt-1", h.coord.state, h.coord.msg, h.coord.saved)
	}
}

// TestUpdateRefusals: updates the round state machine refuses map to
// gRPC codes and leave the job running.
func TestUpdateRefusals(t *testing.T) {
	h := newHarness(t, testSpec(2), "")
	h.join(0)
	h.join(1)
	err := h.update(0, 1)
	wantCode(t, "update before the first round opened", err, codes.FailedPrecondition, "before the first round opened")
	h.join(2)
	if err := h.update(0, 1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "second update for round 1", h.update(0, 1), codes.AlreadyExists, "")
	wantCode(t, "update for round 2 during round 1", h.update(1, 2), codes.InvalidArgument, "round 2")
	if h.coord.ends != 0 {
		t.Errorf("the job ended (%s: %s) on refused updates", h.coord.state, h.coord.msg)
	}
}
