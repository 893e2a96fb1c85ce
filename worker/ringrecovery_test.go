package worker

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestChooseMemory is the agreement's pure core: which snapshot step a new
// generation starts from, and which rank sends it.
func TestChooseMemory(t *testing.T) {
	none := snapInfo{newest: -1, older: -1}
	cases := []struct {
		name  string
		infos []snapInfo
		gen   uint64
		step  int64
		src   int
		newer int64
	}{
		{"ranks one step apart", []snapInfo{{3, 41, 40}, {3, 40, 39}, {3, 41, 40}}, 4, 40, 0, 41},
		{"the slow rank first", []snapInfo{{3, 40, 39}, {3, 41, 40}}, 4, 40, 0, 41},
		{"all at the same step", []snapInfo{{3, 41, 40}, {3, 41, 40}}, 4, 41, 0, 41},
		{"a joiner with nothing", []snapInfo{none, {3, 41, 40}, {3, 40, 39}}, 4, 40, 1, 41},
		{"one survivor with one snapshot", []snapInfo{none, {2, 12, -1}}, 4, 12, 1, 12},
		{"nobody has anything", []snapInfo{none, none, none}, 2, -1, -1, -1},
		{"a stale rank counts as a joiner", []snapInfo{{1, 7, 6}, {3, 41, 40}, {3, 41, 40}}, 4, 41, 1, 41},
		{"snapshots of this generation or later are ignored", []snapInfo{{5, 90, 89}, {3, 41, 40}}, 4, 41, 1, 41},
		{"nothing in common", []snapInfo{{3, 45, 44}, {3, 41, 40}}, 4, -1, -1, 45},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := chooseMemory(c.infos, c.gen)
			if got.step != c.step || got.src != c.src || got.newest != c.newer {
				t.Errorf("chooseMemory = step %d from rank %d (newest %d), want step %d from rank %d (newest %d)",
					got.step, got.src, got.newest, c.step, c.src, c.newer)
			}
		})
	}
	// The encoding is exact for any int64, -1 included.
	var b [infoLen]float32
	in := snapInfo{gen: 1<<40 + 3, newest: 1<<50 + 12345, older: -1}
	in.encode(b[:])
	if out := decodeInfo(b[:]); out != in {
		t.Errorf("decodeInfo(encode(%+v)) = %+v", in, out)
	}
}

// ringRank is one rank of a test ring: its model and synchroniser.
type ringRank struct {
	net   *models.Network
	rs    *ringSync
	snaps *jobSnapshots
}

// testRing builds world ranks of generation gen over an in-memory ring;
// seed0 is rank 0's model seed (others use seed0+rank, so a missing
// broadcast shows).
func testRing(t *testing.T, spec *pb.JobSpec, world int, gen uint64, total int64, seed0 int64) []*ringRank {
	t.Helper()
	rings := aggregator.NewMemRing(world, 4)
	out := make([]*ringRank, world)
	for r := range world {
		net, err := models.New(spec.Model, models.Options{Seed: seed0 + int64(r)})
		if err != nil {
			t.Fatal(err)
		}
		rs, err := newRingSync(context.Background(), rings[r], nil, &pb.Assignment{Generation: gen, Spec: spec}, net, total, nil)
		if err != nil {
			t.Fatal(err)
		}
		out[r] = &ringRank{net: net, rs: rs, snaps: &jobSnapshots{}}
	}
	return out
}

// onAll runs f on every rank concurrently and fails on the first error.
func onAll(t *testing.T, ranks []*ringRank, f func(ctx context.Context, r int, rk *ringRank) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, rk := range ranks {
		wg.Go(func() { errs[r] = f(ctx, r, rk) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// trainer computes the gradient of rank r's batch of a step on a fixed
// synthetic set (the batch depends on the step and rank only).
type trainer struct {
	train *data.Dataset
	bs    int
	// grads, if set, sees rank r's gradient of step s before the ring
	// reduces it (to scale or poison it)
	grads func(r int, s int64, rk *ringRank, g []float32)
}

func newTestTrainer(t *testing.T) *trainer {
	train, _, err := data.Synthetic(512, 10, 7)
	if err != nil {
		t.Fatal(err)
	}
	return &trainer{train: train, bs: 8}
}

func (tr *trainer) step(ctx context.Context, rk *ringRank, rank int, step int64) error {
	idx := make([]int, tr.bs)
	for i := range idx {
		idx[i] = int((step*int64(tr.bs)*4 + int64(rank*tr.bs+i)) % int64(tr.train.Len()))
	}
	net := rk.net
	x := make([]float32, len(idx)*net.InputSize())
	y := make([]int32, len(idx))
	tr.train.Batch(idx, x, y)
	net.ZeroGrad()
	logits := net.Forward(x, len(idx), true)
	dl := make([]float32, len(logits))
	models.SoftmaxCrossEntropy(logits, y, 10, dl)
	net.Backward(dl)
	if tr.grads != nil {
		tr.grads(rank, step, rk, net.Grads())
	}
	return rk.rs.step(ctx, net.Grads(), net.Params())
}

func recoverySpec(t *testing.T, compression string) *pb.JobSpec {
	t.Helper()
	in := &pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: &pb.DatasetSpec{Name: "synthetic"}, Workers: proto.Int32(3), BatchSize: proto.Int32(8),
		Optimizer: &pb.OptimizerSpec{Name: "sgd", Lr: proto.Float64(0.05), Momentum: proto.Float64(0.9)}}
	if compression != "" {
		in.Compression = &pb.CompressionSpec{Type: compression, StartIter: -1}
	}
	spec, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// flatState is a rank's reducer state, copied.
func flatState(rs *ringSync) compress.Flat {
	ns, no := rs.state.FlatLen()
	fl := compress.Flat{Shared: make([]float32, ns), Own: make([]float32, no)}
	rs.state.CopyState(&fl)
	return fl
}

// TestAgreeRanksOneStepApart: a rank of three is lost while the others are
// one step apart (two finished step 5, one did not). The new generation —
// the two survivors renumbered and a joiner with nothing — starts from
// step 4, the newest state all survivors hold, sent by the lowest rank
// holding it; parameters, momentum and PowerSGD's Q come from it, each
// survivor keeps its own error feedback and the joiner starts with none.
func TestAgreeRanksOneStepApart(t *testing.T) {
	spec := recoverySpec(t, "powersgd")
	tr := newTestTrainer(t)
	old := testRing(t, spec, 3, 1, 100, 3)
	onAll(t, old, func(ctx context.Context, r int, rk *ringRank) error {
		return rk.rs.broadcastParams(ctx, rk.net.Params())
	})
	var ref struct {
		params, momentum []float32
		red              []compress.Flat
	}
	for s := int64(0); s < 5; s++ {
		onAll(t, old, func(ctx context.Context, r int, rk *ringRank) error {
			if err := tr.step(ctx, rk, r, s); err != nil {
				return err
			}
			if s == 4 && r == 2 {
				return nil // rank 2 never finished step 5 (its snapshot is missing)
			}
			rk.snaps.take(1, s+1, 0, (s+1)*24, rk.net, rk.rs.optim, rk.rs.state, rk.rs.scaler)
			return nil
		})
		if s == 3 { // the state after step 4
			ref.params = slices.Clone(old[0].net.Params())
			ref.momentum = slices.Clone(old[0].rs.optim.(*optim.SGD).State())
			for _, rk := range old {
				ref.red = append(ref.red, flatState(rk.rs))
			}
		}
	}
	if !ref.red[0].SharedSet || slices.Equal(ref.red[1].Own, ref.red[2].Own) {
		t.Fatal("test setup: PowerSGD should have set Q and rank-specific error feedback by step 4")
	}

	// Old rank 0 is lost; old ranks 1, 2 become ranks 0, 1; rank 2 joins.
	gen2 := testRing(t, spec, 3, 2, 100, 50)
	gen2[0].snaps, gen2[1].snaps = old[1].snaps, old[2].snaps
	points := make([]startPoint, 3)
	onAll(t, gen2, func(ctx context.Context, r int, rk *ringRank) error {
		sp, err := rk.rs.agree(ctx, rk.snaps, 2, -1, 5, rk.net)
		points[r] = sp
		return err
	})
	for r, sp := range points {
		if sp.source != fromMemory || sp.step != 4 || sp.srcRank != 0 || sp.newest != 5 || sp.epoch != 0 || sp.consumed != 4*24 {
			t.Errorf("rank %d starts from %+v; want memory, step 4 from rank 0, newest 5, consumed 96", r, sp)
		}
		rk := gen2[r]
		if !slices.Equal(rk.net.Params(), ref.params) {
			t.Errorf("rank %d: parameters differ from the state after step 4", r)
		}
		if !slices.Equal(rk.rs.optim.(*optim.SGD).State(), ref.momentum) {
			t.Errorf("rank %d: momentum differs from the state after step 4", r)
		}
		if rk.rs.steps != 4 {
			t.Errorf("rank %d: %d optimiser steps, want 4", r, rk.rs.steps)
		}
		got := flatState(rk.rs)
		if !got.SharedSet || !slices.Equal(got.Shared, ref.red[0].Shared) {
			t.Errorf("rank %d: PowerSGD's Q is not step 4's", r)
		}
		switch r {
		case 0, 1: // survivors: old ranks 1 and 2
			if !slices.Equal(got.Own, ref.red[r+1].Own) {
				t.Errorf("rank %d (old rank %d): error feedback is not its own at step 4", r, r+1)
			}
		case 2:
			if slices.ContainsFunc(got.Own, func(v float32) bool { return v != 0 }) {
				t.Error("the joiner's error feedback is not zero")
			}
		}
	}
	// The new ring trains on from there, in sync.
	onAll(t, gen2, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, 4) })
	for r := 1; r < 3; r++ {
		if !slices.Equal(gen2[r].net.Params(), gen2[0].net.Params()) {
			t.Errorf("rank %d's parameters differ from rank 0's after the first step of generation 2", r)
		}
	}
}

// TestAgreeFallbacks: with no snapshot anywhere a generation starts from
// the checkpoint, else from scratch (rank 0's parameters), else — when
// steps had been trained — fails; a snapshot older than the checkpoint
// loses to it.
func TestAgreeFallbacks(t *testing.T) {
	spec := recoverySpec(t, "topk")
	run := func(ranks []*ringRank, gen uint64, ckptStep, trained int64) ([]startPoint, []error) {
		points, errs := make([]startPoint, len(ranks)), make([]error, len(ranks))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for r, rk := range ranks {
			wg.Go(func() { points[r], errs[r] = rk.rs.agree(ctx, rk.snaps, gen, ckptStep, trained, rk.net) })
		}
		wg.Wait()
		return points, errs
	}
	t.Run("scratch", func(t *testing.T) {
		ranks := testRing(t, spec, 3, 1, 10, 3)
		points, errs := run(ranks, 1, -1, 0)
		for r := range ranks {
			if errs[r] != nil || points[r].source != fromScratch || points[r].step != 0 {
				t.Fatalf("rank %d: %+v, %v; want scratch", r, points[r], errs[r])
			}
			if !slices.Equal(ranks[r].net.Params(), ranks[0].net.Params()) {
				t.Errorf("rank %d did not get rank 0's parameters", r)
			}
		}
	})
	t.Run("checkpoint", func(t *testing.T) {
		ranks := testRing(t, spec, 2, 3, 10, 3)
		ranks[1].snaps.take(1, 3, 0, 0, ranks[1].net, ranks[1].rs.optim, ranks[1].rs.state, ranks[1].rs.scaler) // older than the checkpoint
		before := slices.Clone(ranks[1].net.Params())
		points, errs := run(ranks, 3, 7, 9)
		for r := range ranks {
			if errs[r] != nil || points[r].source != fromCheckpoint || points[r].newest != 3 {
				t.Fatalf("rank %d: %+v, %v; want the checkpoint", r, points[r], errs[r])
			}
		}
		if !slices.Equal(ranks[1].net.Params(), before) {
			t.Error("the parameters changed although the caller loads the checkpoint")
		}
	})
	t.Run("nothing left", func(t *testing.T) {
		ranks := testRing(t, spec, 2, 4, 10, 3)
		_, errs := run(ranks, 4, -1, 120)
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "no state to go on from") || !strings.Contains(err.Error(), "120 steps") {
				t.Errorf("rank %d: %v; want an error saying the state is lost", r, err)
			}
		}
	})
}

// TestCompressionCheckpointRoundTrip: a checkpoint carries the compression
// state (PowerSGD's Q and every rank's error feedback, top-k's residuals),
// so a resume with the same world continues bit-identically with the
// undisturbed run; without the compression state it would not. With
// another world size Q is kept and the residuals start from zero.
func TestCompressionCheckpointRoundTrip(t *testing.T) {
	const world, at, more = 2, 6, 4
	for _, kind := range []string{"powersgd", "topk"} {
		t.Run(kind, func(t *testing.T) {
			spec := recoverySpec(t, kind)
			tr := newTestTrainer(t)
			dir := t.TempDir()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			ranks := testRing(t, spec, world, 1, at+more, 3)
			onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error {
				return rk.rs.broadcastParams(ctx, rk.net.Params())
			})
			for s := int64(0); s < at; s++ {
				onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
			}
			var path string
			onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error {
				extra, err := rk.rs.compressionExtra(ctx, true)
				if err != nil || r != 0 {
					return err
				}
				c := &checkpointer{dir: dir, spec: spec, jobID: "job-1", world: world}
				path, err = c.save(rk.net, rk.rs.optim, at, 0, at*16, extra, time.Now())
				return err
			})
			for s := int64(at); s < at+more; s++ {
				onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
			}
			want := ranks[0].net.Params()

			resumed := func(world int, withCompression bool) []*ringRank {
				ranks := testRing(t, spec, world, 2, at+more, 90)
				onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error {
					st, err := checkpoint.Load(path)
					if err != nil {
						return err
					}
					if _, err := resume(path, spec, rk.net, rk.rs.optim); err != nil {
						return err
					}
					rk.rs.steps = at
					if withCompression {
						return restoreCompression(st, r, world, rk.rs.state, log, "job-1")
					}
					return nil
				})
				return ranks
			}
			again := resumed(world, true)
			for s := int64(at); s < at+more; s++ {
				onAll(t, again, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
			}
			for r, rk := range again {
				if !slices.Equal(rk.net.Params(), want) {
					t.Errorf("rank %d: resumed with the compression state, the parameters differ from the undisturbed run's", r)
				}
			}
			bare := resumed(world, false)
			for s := int64(at); s < at+more; s++ {
				onAll(t, bare, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
			}
			if slices.Equal(bare[0].net.Params(), want) {
				t.Error("resumed without the compression state, the run is still identical: the test cannot tell")
			}

			// Three ranks: the shared state is restored, the residuals reset.
			three := resumed(3, true)
			for r, rk := range three {
				fl := flatState(rk.rs)
				if kind == "powersgd" && !fl.SharedSet {
					t.Errorf("rank %d of 3: PowerSGD's Q was not restored", r)
				}
				if slices.ContainsFunc(fl.Own, func(v float32) bool { return v != 0 }) {
					t.Errorf("rank %d of 3: error feedback restored across world sizes", r)
				}
			}
		})
	}
}

// TestSnapshotKeepsTwo: the store keeps the last two snapshots, reusing
// their buffers, and drops a job's when asked or when another job comes.
func TestSnapshotKeepsTwo(t *testing.T) {
	spec := recoverySpec(t, "powersgd")
	rk := testRing(t, spec, 1, 1, 10, 3)[0]
	var store snapshotStore
	j := store.forJob("a")
	for s := int64(1); s <= 3; s++ {
		rk.net.Params()[0] = float32(s)
		j.take(1, s, 0, 0, rk.net, rk.rs.optim, rk.rs.state, rk.rs.scaler)
	}
	if got := j.latest(); got == nil || got.step != 3 || got.params[0] != 3 {
		t.Fatalf("latest = %+v, want step 3", got)
	}
	if j.olderStep() != 2 || j.at(2).params[0] != 2 || j.at(1) != nil {
		t.Errorf("older step %d; want 2 held and 1 gone", j.olderStep())
	}
	if store.forJob("a") != j {
		t.Error("the same job got another store")
	}
	if store.forJob("b") == j {
		t.Error("another job got job a's snapshots")
	}
	store.drop("b")
	if store.forJob("b").latest() != nil {
		t.Error("dropped snapshots are still there")
	}
}

// BenchmarkSnapshotTake is the per-step cost of an in-memory snapshot
// (parameters, buffers, SGD momentum, PowerSGD state) for mlp and cnn.
func BenchmarkSnapshotTake(b *testing.B) {
	for _, model := range []string{"mlp", "cnn"} {
		b.Run(model, func(b *testing.B) {
			spec, err := jobspec.Normalize(&pb.JobSpec{Model: model, Mode: "ring", Dataset: &pb.DatasetSpec{Name: "mnist"},
				Compression: &pb.CompressionSpec{Type: "powersgd"}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			net, err := models.New(model, models.Options{Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			rs, err := newRingSync(context.Background(), aggregator.NewMemRing(1, 0)[0], nil, &pb.Assignment{Generation: 1, Spec: spec}, net, 10, nil)
			if err != nil {
				b.Fatal(err)
			}
			o := rs.optim.(*optim.SGD)
			o.Step(net.Params(), net.Grads()) // allocates the momentum buffer
			_, own := rs.state.FlatLen()
			b.SetBytes(int64(4 * (2*len(net.Params()) + len(net.Buffers()) + own)))
			b.ReportAllocs()
			var j jobSnapshots
			for i := 0; b.Loop(); i++ {
				j.take(1, int64(i), 0, 0, net, rs.optim, rs.state, rs.scaler)
			}
		})
	}
}

// resume loads a checkpoint into net and opt and returns where training
// stopped.
func resume(path string, spec *pb.JobSpec, net *models.Network, opt optim.Stepper) (checkpoint.Meta, error) {
	st, err := checkpoint.Load(path)
	if err != nil {
		return checkpoint.Meta{}, err
	}
	if err := restoreCheckpoint(st, path, spec, net, opt); err != nil {
		return checkpoint.Meta{}, err
	}
	return st.Meta, nil
}
