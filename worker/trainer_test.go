package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// fakeSync is a synchronizer that records what the Trainer asks of it:
// its decisions are tested without a ring or a parameter server. step
// leaves the parameters alone.
type fakeSync struct {
	localGradient
	unscaled
	wholeModel
	origin   origin     // what start returns
	from     resumeFrom // what start was given
	steps    int64      // step calls
	failAt   int64      // the step call (1-based) that fails; 0: none
	fail     error
	cancelAt int64 // cancel after the completed call of this step count; 0: never
	cancel   context.CancelFunc
	done     []completedCall // completed calls
	stops    []position      // stopped calls
	closed   bool
}

type completedCall struct {
	epoch int
	at    position
}

func (f *fakeSync) start(_ context.Context, from resumeFrom) (origin, error) {
	f.from = from
	return f.origin, nil
}

func (f *fakeSync) beginStep(context.Context, []float32) (func(int), error) { return nil, nil }

func (f *fakeSync) step(context.Context, []float32, []float32) error {
	f.steps++
	if f.steps == f.failAt {
		return f.fail
	}
	return nil
}

func (f *fakeSync) completed(_ context.Context, epoch int, at position) error {
	f.done = append(f.done, completedCall{epoch, at})
	if at.step == f.cancelAt {
		f.cancel()
	}
	return nil
}

func (f *fakeSync) stopped(_ context.Context, at position) { f.stops = append(f.stops, at) }
func (f *fakeSync) stats() syncStats                       { return syncStats{} }
func (f *fakeSync) close()                                 { f.closed = true }

// testTrainer is rank 0 of 2 on 100 synthetic examples, 8 a step: 7
// steps an epoch, over 2 epochs; its reports go to the returned channel.
func testTrainer(t *testing.T, f *fakeSync, edit func(*pb.JobSpec)) (*Trainer, chan *pb.ConnectRequest) {
	t.Helper()
	in := &pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: &pb.DatasetSpec{Name: "synthetic"}, Workers: proto.Int32(2),
		BatchSize: proto.Int32(8), Epochs: proto.Int32(2), LogEverySteps: 5, EvalEveryEpoch: proto.Bool(true)}
	if edit != nil {
		edit(in)
	}
	spec, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	train, test, err := data.Synthetic(100, 20, 7)
	if err != nil {
		t.Fatal(err)
	}
	obj := newClassification(train, test, spec)
	opt := obj.shape()
	net, err := models.New(spec.Model, opt)
	if err != nil {
		t.Fatal(err)
	}
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Spec: spec, Rank: 0, WorldSize: 2, NumParams: int64(net.NumParams())}
	out := make(chan *pb.ConnectRequest, 1000)
	env := &taskEnv{rep: &reporter{ctx: context.Background(), out: out}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tr, err := newTrainer(a, env, obj)
	if err != nil {
		t.Fatal(err)
	}
	tr.sync = f
	return tr, out
}

// reports drains the reports sent so far.
func reports(out chan *pb.ConnectRequest) (progress []*pb.Progress, evals []*pb.TaskEval) {
	for {
		select {
		case m := <-out:
			if p := m.GetProgress(); p != nil {
				progress = append(progress, p.Progress)
			}
			if e := m.GetEval(); e != nil {
				evals = append(evals, e)
			}
		default:
			return progress, evals
		}
	}
}

// TestTrainerResumesMidEpoch: a generation that starts where a snapshot
// stopped (step 3, 48 positions of epoch 0 consumed) trains the rest of
// that epoch (4 steps) and the next (7), telling the synchronizer each
// step's position — an epoch's end as the next epoch's start — and
// reports progress every 5 steps and after the last, with evaluations
// after each epoch.
func TestTrainerResumesMidEpoch(t *testing.T) {
	f := &fakeSync{origin: origin{at: position{step: 3, consumed: 48}, source: fromMemory}}
	tr, out := testTrainer(t, f, nil)
	res, err := tr.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f.from.ckpt != nil || f.from.at != (position{}) {
		t.Errorf("start was given %+v; want no checkpoint, position zero", f.from)
	}
	var want []completedCall
	for _, c := range []int64{64, 80, 96} {
		want = append(want, completedCall{0, position{step: int64(len(want)) + 4, consumed: c}})
	}
	want = append(want, completedCall{0, position{step: 7, epoch: 1}})
	for b := range 6 {
		want = append(want, completedCall{1, position{step: int64(8 + b), epoch: 1, consumed: int64(16 * (b + 1))}})
	}
	want = append(want, completedCall{1, position{step: 14, epoch: 2}})
	if len(f.done) != len(want) {
		t.Fatalf("completed %d steps, want %d: %+v", len(f.done), len(want), f.done)
	}
	for i := range want {
		if f.done[i] != want[i] {
			t.Errorf("completed call %d: %+v, want %+v", i, f.done[i], want[i])
		}
	}
	if f.steps != 11 || len(f.stops) != 0 {
		t.Errorf("%d steps and stopped at %v; want 11 steps, no stop", f.steps, f.stops)
	}
	if res.Steps != 14 || res.Epochs != 2 {
		t.Errorf("result: %d steps, %d epochs; want 14, 2", res.Steps, res.Epochs)
	}
	progress, evals := reports(out)
	var steps []int64
	for _, p := range progress {
		steps = append(steps, p.Step)
		if p.TotalSteps != 14 {
			t.Errorf("progress at step %d says %d steps in all, want 14", p.Step, p.TotalSteps)
		}
	}
	if len(steps) != 3 || steps[0] != 5 || steps[1] != 10 || steps[2] != 14 {
		t.Errorf("progress at steps %v, want [5 10 14]", steps)
	}
	if len(evals) != 2 || evals[0].Step != 7 || evals[1].Step != 14 {
		t.Errorf("%d evaluations; want 2, after steps 7 and 14", len(evals))
	}
}

// TestTrainerStopsEarly: a cancelled task and a failed step leave the
// synchronizer the position after the last completed step to keep; a
// task that trained nothing leaves nothing; max_steps ends training
// mid-epoch.
func TestTrainerStopsEarly(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := &fakeSync{origin: origin{source: fromScratch}, cancelAt: 5, cancel: cancel}
		tr, _ := testTrainer(t, f, nil)
		if _, err := tr.run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v, want context.Canceled", err)
		}
		if len(f.stops) != 1 || f.stops[0] != (position{step: 5, consumed: 80}) {
			t.Errorf("stopped at %+v, want once at step 5, 80 consumed", f.stops)
		}
	})
	t.Run("cancelled during an epoch's evaluation", func(t *testing.T) {
		// Cancelled right after epoch 0's last step (7): rank 0's
		// evaluation sees the cancel, and the state after step 7 is still
		// kept, so a resume right after the cancel finds it.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := &fakeSync{origin: origin{source: fromScratch}, cancelAt: 7, cancel: cancel}
		tr, _ := testTrainer(t, f, nil)
		if _, err := tr.run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v, want context.Canceled", err)
		}
		last := f.done[len(f.done)-1].at
		if len(f.stops) != 1 || f.stops[0] != last || last.step != 7 {
			t.Errorf("stopped at %+v, want once at step 7's position %+v", f.stops, last)
		}
	})
	t.Run("cancelled during the final evaluation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := &fakeSync{origin: origin{source: fromScratch}, cancelAt: 9, cancel: cancel}
		tr, _ := testTrainer(t, f, func(s *pb.JobSpec) { s.MaxSteps = 9; s.EvalEveryEpoch = proto.Bool(false) })
		if _, err := tr.run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v, want context.Canceled", err)
		}
		last := f.done[len(f.done)-1].at
		if len(f.stops) != 1 || f.stops[0] != last || last.step != 9 {
			t.Errorf("stopped at %+v, want once at step 9's position %+v", f.stops, last)
		}
	})
	t.Run("nothing trained", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		f := &fakeSync{origin: origin{at: position{step: 3, consumed: 48}, source: fromMemory}}
		tr, _ := testTrainer(t, f, nil)
		if _, err := tr.run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v, want context.Canceled", err)
		}
		if len(f.stops) != 0 || f.steps != 0 {
			t.Errorf("%d steps, stopped at %+v; want nothing", f.steps, f.stops)
		}
	})
	t.Run("a failed step", func(t *testing.T) {
		boom := errors.New("boom")
		f := &fakeSync{origin: origin{source: fromScratch}, failAt: 3, fail: boom}
		tr, _ := testTrainer(t, f, nil)
		_, err := tr.run(context.Background())
		if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "step 2: ") {
			t.Fatalf("run: %v, want step 2's error wrapping boom", err)
		}
		if len(f.stops) != 1 || f.stops[0] != (position{step: 2, consumed: 32}) {
			t.Errorf("stopped at %+v, want once at step 2, 32 consumed", f.stops)
		}
	})
	t.Run("max_steps", func(t *testing.T) {
		f := &fakeSync{origin: origin{source: fromScratch}}
		tr, out := testTrainer(t, f, func(s *pb.JobSpec) { s.MaxSteps = 9 })
		res, err := tr.run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		last := f.done[len(f.done)-1]
		if res.Steps != 9 || last != (completedCall{1, position{step: 9, epoch: 1, consumed: 32}}) {
			t.Errorf("%d steps, last completed %+v; want 9, at 32 of epoch 1", res.Steps, last)
		}
		// Epoch 1 was cut short: one evaluation after epoch 0, one at the end.
		if _, evals := reports(out); len(evals) != 2 || evals[1].Step != 9 {
			t.Errorf("%d evaluations; want 2, the last after step 9", len(evals))
		}
	})
}

// TestRingTaskCheckpointDue: a ring rank writes a checkpoint when the
// spec says one is due — here every 4 steps and at every epoch's end —
// recording the position the step reached (an epoch's end as the next
// epoch's start), and none for steps between.
func TestRingTaskCheckpointDue(t *testing.T) {
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: &pb.DatasetSpec{Name: "synthetic"},
		Workers: proto.Int32(1), Checkpoint: &pb.CheckpointSpec{EverySteps: 4, EveryEpochs: 1, Keep: 100}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	net, err := models.New(spec.Model, models.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Spec: spec, Rank: 0, WorldSize: 1, CheckpointDir: dir}
	out := make(chan *pb.ConnectRequest, 10)
	env := &taskEnv{rep: &reporter{ctx: context.Background(), out: out}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plan := stepPlan{trainLen: 30, world: 1, batch: 5, perEpoch: 6, epochs: 2}
	rs, err := newRingSync(ctx, aggregator.NewMemRing(1, 0)[0], nil, a, net, plan.total(position{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRingTask(rs, a, env, net)
	defer r.close()
	o, err := r.start(ctx, resumeFrom{plan: plan})
	if err != nil || o.source != fromScratch {
		t.Fatalf("start: %+v, %v; want scratch", o, err)
	}
	if m := <-out; m.GetStarted().GetSource() != fromScratch {
		t.Errorf("rank 0 reported %v, want a start from scratch", m)
	}
	var written []position
	for s := int64(1); s <= 12; s++ {
		e, b := int((s-1)/6), int((s-1)%6)
		at := plan.after(s, e, 0, b, 6)
		if err := r.completed(ctx, e, at); err != nil {
			t.Fatal(err)
		}
		st, _, _, err := checkpoint.Latest(dir)
		if err == nil && (len(written) == 0 || st.Meta.Step != written[len(written)-1].step) {
			written = append(written, position{step: st.Meta.Step, epoch: st.Meta.Epoch, consumed: st.Meta.EpochConsumed})
		}
	}
	want := []position{{step: 4, consumed: 20}, {step: 6, epoch: 1}, {step: 8, epoch: 1, consumed: 10}, {step: 12, epoch: 2}}
	if len(written) != len(want) {
		t.Fatalf("checkpoints at %+v, want %+v", written, want)
	}
	for i := range want {
		if written[i] != want[i] {
			t.Errorf("checkpoint %d at %+v, want %+v", i, written[i], want[i])
		}
	}
	if st := r.stats(); st.snapshots != 13 {
		t.Errorf("%d snapshots, want 13 (the start and every step)", st.snapshots)
	}
}
