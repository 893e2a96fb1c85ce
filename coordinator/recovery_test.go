package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// clock is the scripts' fake clock: t(3) is 3 s after the start.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func wantPhase(t *testing.T, r *coordinator.Recovery, want coordinator.Phase) {
	t.Helper()
	if got := r.Phase(); got != want {
		t.Fatalf("phase %v; want %v", got, want)
	}
}

// TestRecoveryFromMemory: w2 of {w0, w1, w2} is lost at t=3 s (silent
// since t=1 s) after step 30; generation 2 is assigned to w0, w1 and the
// idle w3, and it starts from rank 1's in-memory snapshot at step 29.
func TestRecoveryFromMemory(t *testing.T) {
	var r coordinator.Recovery
	wantPhase(t, &r, coordinator.Steady)
	ids, ok := r.Plan([]string{"w0", "w1"}, []string{"w3", "w4"}, 3, 2, false)
	if !ok {
		t.Fatal("plan refused")
	}
	if diff := cmp.Diff([]string{"w0", "w1", "w3"}, ids); diff != "" {
		t.Fatalf("generation 2's workers (-want +got)\n%s", diff)
	}
	r.Begin(at(3), "w2", 2*time.Second, 30, "")
	wantPhase(t, &r, coordinator.Rejoining)
	if r.Trained() != 30 {
		t.Fatalf("trained %d; want 30", r.Trained())
	}
	// A progress report of the new generation before its TaskStarted is
	// not how this script goes: rank 0 says where it started first.
	out, ended := r.Started(at(4.5), &pb.TaskStarted{Generation: 2, Source: "memory", SourceRank: 1, Step: 29, NewestStep: 30, AgreeSeconds: 0.2}, len(ids))
	if !ended {
		t.Fatal("TaskStarted did not end the rejoin")
	}
	wantPhase(t, &r, coordinator.Steady)
	for _, s := range []string{"loss of w2 in 1.5s", "silent 2.0s", "generation 2 on 3 worker(s)", "in-memory snapshot of rank 1 at step 29", "1 step(s) redone"} {
		if !strings.Contains(out.Message, s) {
			t.Errorf("message %q lacks %q", out.Message, s)
		}
	}
	if out.Record["kind"] != "recovered" || out.Record["steps_redone"] != int64(1) || out.Record["source"] != "memory" || out.Record["recovery_seconds"] != 1.5 {
		t.Errorf("record %v", out.Record)
	}
	if _, again := r.Started(at(5), &pb.TaskStarted{Generation: 2, Source: "memory", Step: 29}, 3); again {
		t.Error("a second TaskStarted ended a rejoin again")
	}
	if _, again := r.Progressed(at(5), 2, 3, 30); again {
		t.Error("progress after the rejoin ended it again")
	}
}

// TestRecoveryFromCheckpointByProgress: a generation whose workers do not
// say where they started ends its rejoin at its first progress report,
// counting the steps redone from the checkpoint's step.
func TestRecoveryFromCheckpointByProgress(t *testing.T) {
	var r coordinator.Recovery
	r.Begin(at(10), "w1", 5*time.Second, 47, "/runs/j/checkpoints/pinned/g2/ckpt-00000040")
	out, ended := r.Progressed(at(12), 2, 2, 41)
	if !ended {
		t.Fatal("progress did not end the rejoin")
	}
	if !strings.Contains(out.Message, "training again from step 40 (about 7 steps redone)") {
		t.Errorf("message %q", out.Message)
	}
	if out.Record["checkpoint"] != "/runs/j/checkpoints/pinned/g2/ckpt-00000040" || out.Record["steps_redone"] != int64(7) {
		t.Errorf("record %v", out.Record)
	}
}

// TestRecoveryFromOwnStateByProgress: with no checkpoint, a generation
// whose first report is of a later step went on from a state of its own
// (an entrypoint's command loaded what it saved): the message says so.
func TestRecoveryFromOwnStateByProgress(t *testing.T) {
	var r coordinator.Recovery
	r.Begin(at(10), "w1", time.Second, 12, "")
	out, ended := r.Progressed(at(12), 2, 2, 9)
	if !ended || !strings.Contains(out.Message, "its first report is of step 9 (the last before the loss: 12)") ||
		out.Record["steps_redone"] != int64(4) || out.Record["first_step_reported"] != int64(9) {
		t.Errorf("ended %v, message %q, record %v", ended, out.Message, out.Record)
	}
}

// TestRecoveryTooFewWorkers: a job below min_workers after the loss is
// not recovered (the caller fails it).
func TestRecoveryTooFewWorkers(t *testing.T) {
	var r coordinator.Recovery
	if ids, ok := r.Plan([]string{"w0"}, nil, 3, 2, false); ok {
		t.Fatalf("recovered onto %v below min_workers 2", ids)
	}
	wantPhase(t, &r, coordinator.Steady)
}

// TestRecoveryFailsAfterDeadline: a ring rank's broken step starts the
// Failing phase; nothing happens until the deadline (5 s), then the job
// fails with the rank's error; a second failure keeps the first deadline
// and is added to the message (the rank whose own error broke the ring
// may report after its neighbour's "peer gone"); a third of another
// generation is not.
// If the job moved on to another generation meanwhile (a recovery that
// then broke too), the message says there was no recovery.
func TestRecoveryFailsAfterDeadline(t *testing.T) {
	var r coordinator.Recovery
	r.RankFailed(at(1), 1, "rank 1 (worker w1): ring broke", 5*time.Second)
	wantPhase(t, &r, coordinator.Failing)
	r.RankFailed(at(4), 1, "rank 2 (worker w2): ring broke", 5*time.Second)
	r.RankFailed(at(4.5), 1, "rank 2 (worker w2): ring broke", 5*time.Second) // the same again: once
	r.RankFailed(at(4.6), 2, "rank 0 (worker w0): ring broke", 5*time.Second)
	if _, due := r.Due(at(5.9), 1); due {
		t.Fatal("due before the deadline")
	}
	if _, due := r.Due(at(6), 1); due {
		t.Fatal("due at the deadline itself; want after it")
	}
	msg, due := r.Due(at(6.1), 1)
	const both = "rank 1 (worker w1): ring broke; also rank 2 (worker w2): ring broke"
	if !due || msg != both {
		t.Fatalf("due %v %q", due, msg)
	}
	if msg, _ := r.Due(at(7), 2); msg != both+" (no recovery)" {
		t.Fatalf("after a generation change: %q", msg)
	}
}

// TestRecoveryEndsFailing: a lost worker seen before the deadline turns
// the waiting failure into a recovery; the job then does not fail.
func TestRecoveryEndsFailing(t *testing.T) {
	var r coordinator.Recovery
	r.RankFailed(at(1), 1, "rank 0: ring broke", 5*time.Second)
	r.Begin(at(2), "w2", time.Second, 12, "")
	wantPhase(t, &r, coordinator.Rejoining)
	if _, due := r.Due(at(100), 2); due {
		t.Fatal("the failure survived the recovery")
	}
	// The new generation breaks before it starts: Failing again, while
	// still rejoining.
	r.RankFailed(at(3), 2, "rank 1: ring broke", 5*time.Second)
	wantPhase(t, &r, coordinator.Failing)
	if !r.Rejoining() {
		t.Fatal("the rejoin was forgotten")
	}
}

// TestGrowth: a job running on 2 of its 3 workers grows onto an idle
// worker, and only when one is there.
func TestGrowth(t *testing.T) {
	var r coordinator.Recovery
	if ids, ok := r.Plan([]string{"w0", "w1"}, nil, 3, 2, true); ok {
		t.Fatalf("grew onto %v with no idle worker", ids)
	}
	ids, ok := r.Plan([]string{"w0", "w1"}, []string{"w5", "w6"}, 3, 2, true)
	if !ok || !cmp.Equal(ids, []string{"w0", "w1", "w5"}) {
		t.Fatalf("grew onto %v (%v); want w0 w1 w5", ids, ok)
	}
	r.Begin(at(20), "", 0, 80, "")
	out, ended := r.Started(at(21), &pb.TaskStarted{Generation: 3, Source: "memory", Step: 80, NewestStep: 80}, 3)
	if !ended || !strings.HasPrefix(out.Message, "grew to 3 workers in 1.0s: generation 3 starts from the in-memory snapshot of rank 0 at step 80; 0 step(s) redone") {
		t.Fatalf("growth outcome %v %q", ended, out.Message)
	}
}

// TestCutLinkEviction: every rank of generation 1 reports its frame
// counts; once they name the rank cut off (rank 1), its worker is
// evicted and never planned back into the job, even when idle; reports
// of an older generation do not mix with the new one's.
func TestCutLinkEviction(t *testing.T) {
	var r coordinator.Recovery
	l := func(sent, recv int64, idle float64) *pb.RingLinks {
		return &pb.RingLinks{FramesSent: sent, FramesReceived: recv, LeftIdleSeconds: idle}
	}
	if _, _, ok := r.RingFailed(1, 3, 0, l(40, 38, 0.1), 1.5); ok {
		t.Fatal("named a culprit from one report")
	}
	if _, _, ok := r.RingFailed(1, 3, 1, l(38, 36, 2.9), 1.5); ok {
		t.Fatal("named a culprit from two reports")
	}
	rank, why, ok := r.RingFailed(1, 3, 2, l(38, 38, 0.2), 1.5)
	if !ok || rank != 1 || !strings.Contains(why, "rank 0 sent 40 frames to rank 1, 36 arrived") {
		t.Fatalf("culprit %d %v %q", rank, ok, why)
	}
	r.Evict("w1")
	ids, ok := r.Plan([]string{"w0", "w2"}, []string{"w1", "w3"}, 3, 2, false)
	if !ok || !cmp.Equal(ids, []string{"w0", "w2", "w3"}) {
		t.Fatalf("planned %v; want w0 w2 w3 (never the evicted w1)", ids)
	}
	// Generation 2: one report of generation 1 arriving late is not
	// counted with generation 2's.
	r.RingFailed(1, 3, 0, l(40, 38, 0.1), 1.5)
	r.RingFailed(2, 3, 1, l(38, 36, 2.9), 1.5)
	if _, _, ok := r.RingFailed(2, 3, 2, l(38, 38, 0.2), 1.5); ok {
		t.Fatal("a culprit from reports of two generations")
	}
	if _, _, ok := r.RingFailed(2, 3, 5, l(1, 1, 0), 1.5); ok {
		t.Fatal("a rank out of range counted")
	}
}

// TestLifecycle: the job lifecycle's allowed steps.
func TestLifecycle(t *testing.T) {
	const (
		pending   = pb.JobState_JOB_STATE_PENDING
		running   = pb.JobState_JOB_STATE_RUNNING
		succeeded = pb.JobState_JOB_STATE_SUCCEEDED
		failed    = pb.JobState_JOB_STATE_FAILED
		cancelled = pb.JobState_JOB_STATE_CANCELLED
	)
	ok := [][2]pb.JobState{{pending, running}, {pending, failed}, {pending, cancelled}, {running, succeeded}, {running, failed}, {running, cancelled}}
	bad := [][2]pb.JobState{{pending, succeeded}, {running, running}, {running, pending}, {succeeded, running}, {failed, cancelled}, {cancelled, pending}}
	for _, s := range ok {
		if err := coordinator.Transition(s[0], s[1]); err != nil {
			t.Errorf("%v → %v refused: %v", s[0], s[1], err)
		}
	}
	for _, s := range bad {
		if err := coordinator.Transition(s[0], s[1]); err == nil {
			t.Errorf("%v → %v allowed", s[0], s[1])
		}
	}
	if !coordinator.Elastic(&pb.JobSpec{Mode: "ring", Workers: ptr(int32(3)), MinWorkers: 2}) || coordinator.Elastic(&pb.JobSpec{Mode: "ps", Workers: ptr(int32(3)), MinWorkers: 2}) {
		t.Error("Elastic: want ring jobs with min_workers < workers only")
	}
}

func ptr[T any](v T) *T { return &v }

// TestRecoveryPinning: a decided recovery waits in the Pinning phase for
// its checkpoint pin; a second loss meanwhile keeps the first's record;
// Pinned hands it back once, and the recovery goes on to Rejoining.
func TestRecoveryPinning(t *testing.T) {
	var r coordinator.Recovery
	r.AwaitPin(coordinator.Pin{Gen: 1, Lost: "w2", Reason: "no heartbeat", FailMsg: "worker w2 lost", Silent: 5 * time.Second})
	wantPhase(t, &r, coordinator.Pinning)
	r.AwaitPin(coordinator.Pin{Gen: 1, Lost: "w1"})
	p, ok := r.Pinned()
	if !ok || p.Lost != "w2" || p.FailMsg != "worker w2 lost" {
		t.Fatalf("pinned %+v %v; want the first loss", p, ok)
	}
	if _, again := r.Pinned(); again {
		t.Fatal("Pinned twice")
	}
	r.Begin(at(6), p.Lost, p.Silent, 10, "")
	wantPhase(t, &r, coordinator.Rejoining)
}
