package federation

// Tests of the round driver's checkpoints and of resuming from them
// (the round rules are in driver_test.go; the harness is there too).

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestCheckpointAfterClosedRounds: with every_steps 2 a checkpoint is
// written as round 2 closes; a job stopped after round 3 writes its
// state then, and only once.
func TestCheckpointAfterClosedRounds(t *testing.T) {
	dir := t.TempDir()
	spec := testSpec(2)
	spec.Checkpoint = &pb.CheckpointSpec{EverySteps: 2}
	h := newHarness(t, spec, dir)
	for k := range 3 {
		h.join(k)
	}
	names := func() []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "ckpt-") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	for round := 1; round <= 2; round++ {
		for k := range 3 {
			if err := h.update(k, round); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"ckpt-2"}
		if round == 1 {
			want = nil
		}
		if got := names(); !slices.Equal(got, want) {
			t.Fatalf("after round %d: checkpoints %v, want %v", round, got, want)
		}
	}
	for k := range 3 {
		if err := h.update(k, 3); err != nil {
			t.Fatal(err)
		}
	}
	// The job is cancelled while the final evaluation is pending.
	h.d.Abort(errors.New("cancelled"))
	path, err := h.d.SaveStopped(h.now)
	if err != nil || path != filepath.Join(dir, "ckpt-3") {
		t.Fatalf("checkpoint at stop: %q, %v; want %s", path, err, filepath.Join(dir, "ckpt-3"))
	}
	snap, err := federated.LoadCheckpoint(path, jobspec.CheckpointHash(spec))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Completed != 3 || snap.Round != 3 {
		t.Errorf("checkpoint at stop: %d rounds closed, round %d; want 3, 3", snap.Completed, snap.Round)
	}
	if path, err := h.d.SaveStopped(h.now); path != "" || err != nil {
		t.Errorf("second checkpoint at stop: %q, %v; want none (the newest is of round 3)", path, err)
	}
}

// TestResumeFromCheckpoint: a job resumed from the checkpoint of round 2
// opens round 3 with that checkpoint's global model and ends after it,
// with the global model of the run that was not interrupted; one resumed
// from the checkpoint of its last round only asks for the final
// evaluation, and ends with the same result.
func TestResumeFromCheckpoint(t *testing.T) {
	spec := testSpec(2)
	spec.Federated.Strategy, spec.Federated.ServerMomentum = "fedavgm", 0.9 // server state to restore
	spec.Checkpoint = &pb.CheckpointSpec{EverySteps: 1}
	// The deltas differ by client and round, so that the rounds change
	// the model.
	run := func(h *harness, from, to int) {
		t.Helper()
		for round := from; round <= to; round++ {
			for k := range 3 {
				h.d.mu.Lock()
				delta := make([]float32, h.d.params)
				for i := range delta {
					delta[i] = float32(k+round) * 1e-3
				}
				err := h.d.updateLocked(h.d.sessions[k], federated.Update{Client: k, Round: round, Delta: delta, NumExamples: 10 * (k + 1)})
				h.d.mu.Unlock()
				h.d.flush()
				if err != nil {
					t.Fatalf("round %d, client %d: %v", round, k, err)
				}
			}
			if err := h.eval(0, round); err != nil {
				t.Fatalf("evaluation of round %d: %v", round, err)
			}
		}
	}
	wholeDir := t.TempDir()
	whole := newHarness(t, spec, wholeDir)
	for k := range 3 {
		whole.join(k)
	}
	run(whole, 1, 3)
	if whole.coord.state != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("undisturbed job: %s %q", whole.coord.state, whole.coord.msg)
	}

	dir := t.TempDir()
	part := newHarness(t, spec, dir)
	for k := range 3 {
		part.join(k)
	}
	run(part, 1, 2)
	part.d.Abort(errors.New("cancelled"))
	resumed := resumeHarness(t, spec, t.TempDir(), filepath.Join(dir, "ckpt-2"))
	c0 := resumed.join(0)
	resumed.join(1)
	resumed.join(2)
	if r, _ := rounds(c0); !slices.Equal(r, []int32{3}) {
		t.Fatalf("resumed job opened rounds %v, want round 3", r)
	}
	run(resumed, 3, 3)
	if resumed.coord.state != pb.JobState_JOB_STATE_SUCCEEDED || resumed.coord.result.GetSteps() != 3 ||
		resumed.coord.result.GetParameterChecksum() != whole.coord.result.GetParameterChecksum() {
		t.Fatalf("resumed job: %s %q, result %v; want SUCCEEDED with the undisturbed result %v",
			resumed.coord.state, resumed.coord.msg, resumed.coord.result, whole.coord.result)
	}

	final := resumeHarness(t, spec, t.TempDir(), filepath.Join(wholeDir, "ckpt-3"))
	c0 = final.join(0)
	final.join(1)
	final.join(2)
	var asked []int32
	for len(c0.out) > 0 {
		m := <-c0.out
		if ev := m.resp.GetEval(); ev != nil {
			asked = append(asked, ev.Round)
		}
		if m.resp.GetRound() != nil {
			t.Errorf("resumed from its last round: round %v opened", m.resp.GetRound())
		}
	}
	if !slices.Equal(asked, []int32{3}) {
		t.Fatalf("resumed from its last round: evaluations asked %v, want round 3 only", asked)
	}
	if err := final.eval(0, 3); err != nil {
		t.Fatal(err)
	}
	if final.coord.state != pb.JobState_JOB_STATE_SUCCEEDED || final.coord.result.GetSteps() != 3 ||
		final.coord.result.GetParameterChecksum() != whole.coord.result.GetParameterChecksum() {
		t.Errorf("resumed from its last round: %s %q, result %v; want SUCCEEDED with the undisturbed result %v",
			final.coord.state, final.coord.msg, final.coord.result, whole.coord.result)
	}
}
