package worker

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestRingLossScaler drives two ring ranks of an fp16 job through a
// script of steps whose gradients are finite or hold an inf (on one rank
// only) or a NaN, each rank's gradient scaled by the loss scale as
// backward would leave it. Every rank must skip exactly the steps
// GradScaler's algorithm skips (optim.LossScaler run on the script),
// keep the parameters on a skipped step, take the step on the unscaled
// mean otherwise, and report the same skipped count and scale; rank 0
// counts the skipped steps in Prometheus.
func TestRingLossScaler(t *testing.T) {
	const world = 2
	// per step: which rank's gradient is poisoned, and with what (0: none)
	type poison struct {
		rank int
		v    float32
	}
	script := []poison{{}, {0, float32(math.Inf(1))}, {}, {}, {1, float32(math.NaN())}, {1, float32(math.Inf(-1))}, {}, {}}
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: "logreg", Mode: "ring", Precision: "fp16", Dataset: &pb.DatasetSpec{Name: "synthetic"},
		Workers: proto.Int32(world), BatchSize: proto.Int32(4)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &pb.Assignment{Generation: 1, Spec: spec}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// what GradScaler does with the script
	ref, _ := optim.NewLossScaler(optim.ScalerConfig{})
	var wantSkips []bool
	for _, p := range script {
		wantSkips = append(wantSkips, !ref.Update(p.v == 0))
	}

	rings := aggregator.NewMemRing(world, 4)
	rank0Reg := metrics.NewRegistry()
	nets := make([]*models.Network, world)
	type outcome struct {
		skips  []bool
		params [][]float32
		stats  syncStats
	}
	out := make([]outcome, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		nets[r], _ = models.New("logreg", models.Options{Seed: 1})
		wg.Go(func() {
			net := nets[r]
			var reg *metrics.Registry
			if r == 0 {
				reg = rank0Reg
			}
			rs, err := newRingSync(ctx, rings[r], nil, a, net, int64(len(script)), reg)
			if err != nil {
				errs[r] = err
				return
			}
			rs.noOverlap = true
			for s, p := range script {
				before := slices.Clone(net.Params())
				g := net.Grads()
				scale := rs.lossScale()
				for i := range g {
					g[i] = scale * float32(i%7-3) * 0x1p-10 * float32(r+1)
				}
				if p.v != 0 && p.rank == r {
					g[s] = p.v
				}
				skippedBefore := rs.scaler.Skipped()
				if err := rs.step(ctx, g, net.Params()); err != nil {
					errs[r] = err
					return
				}
				skipped := rs.scaler.Skipped() > skippedBefore
				out[r].skips = append(out[r].skips, skipped)
				if skipped && !slices.Equal(before, net.Params()) {
					errs[r] = fmt.Errorf("step %d skipped but the parameters moved", s)
					return
				}
				out[r].params = append(out[r].params, slices.Clone(net.Params()))
			}
			rs.scalerStats(&out[r].stats)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range world {
		if !slices.Equal(out[r].skips, wantSkips) {
			t.Errorf("rank %d skipped %v, want %v", r, out[r].skips, wantSkips)
		}
		if st := out[r].stats; st.skipped != ref.Skipped() || st.lossScale != ref.Scale() {
			t.Errorf("rank %d: %d skipped at scale %v, want %d at %v", r, st.skipped, st.lossScale, ref.Skipped(), ref.Scale())
		}
		for s := range script {
			if !slices.Equal(out[r].params[s], out[0].params[s]) {
				t.Errorf("step %d: rank %d's parameters differ from rank 0's", s, r)
			}
		}
	}
	// Prometheus counts each skipped job step once (rank 0)
	mfs, err := rank0Reg.Prometheus().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "gradsync_nonfinite_steps_skipped_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if counted != float64(ref.Skipped()) {
		t.Errorf("gradsync_nonfinite_steps_skipped_total = %v, want %d", counted, ref.Skipped())
	}
	// the first step is clean: the update is SGD on the unscaled mean
	// gradient, (1+2)/2 · (i%7−3)·2⁻¹⁰, whatever the scale was
	init, _ := models.New("logreg", models.Options{Seed: 1})
	sgd := optim.FromSpec(spec)
	sgd.SetLR(float32(optim.LearningRate(spec, 0, int64(len(script)))))
	g := make([]float32, init.NumParams())
	for i := range g {
		g[i] = 1.5 * float32(i%7-3) * 0x1p-10
	}
	sgd.Step(init.Params(), g)
	if d := maxAbsDiff(init.Params(), out[0].params[0]); d > 1e-7 {
		t.Errorf("first step: parameters differ from SGD on the unscaled mean gradient by %g", d)
	}
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// TestLossScalerCheckpoint writes an fp16 ring rank's checkpoint after a
// scripted history (growth, back-off, skipped steps) and checks that a
// fresh scaler restored from the file has the same state, that a
// checkpoint without the tensor leaves a scaler as it is, and that a
// corrupt one is refused.
func TestLossScalerCheckpoint(t *testing.T) {
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: "logreg", Mode: "ring", Precision: "fp16", Dataset: &pb.DatasetSpec{Name: "synthetic"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := optim.NewLossScaler(optim.ScalerConfig{GrowthInterval: 3})
	for _, finite := range []bool{true, true, true, false, true, false, true} {
		s.Update(finite)
	}
	r := &ringSync{scaler: s}
	extra := map[string]models.Tensor{}
	r.scalerExtra(extra)
	net, _ := models.New("logreg", models.Options{Seed: 1})
	c := &checkpointer{dir: t.TempDir(), spec: spec, jobID: "job-1", world: 2}
	path, err := c.save(net, optim.FromSpec(spec), 7, 0, 7, extra, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := optim.NewLossScaler(optim.ScalerConfig{GrowthInterval: 3})
	if err := restoreScaler(st, fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.State() != s.State() {
		t.Errorf("restored %+v, want %+v", fresh.State(), s.State())
	}
	other, _ := optim.NewLossScaler(optim.ScalerConfig{})
	if err := restoreScaler(&checkpoint.State{}, other); err != nil || other.Scale() != optim.DefaultInitScale {
		t.Errorf("checkpoint without a scaler: %v, scale %v", err, other.Scale())
	}
	bad := models.F32Tensor([]int{2}, []float32{1, 2})
	if err := restoreScaler(&checkpoint.State{Extra: map[string]models.Tensor{extraScaler: bad}}, other); err == nil {
		t.Error("an F32 scaler tensor: no error")
	}
	neg := extra[extraScaler]
	neg.Data = slices.Clone(neg.Data)
	neg.Data[8] = 0xff // growth tracker 255, beyond the interval of 3
	if err := restoreScaler(&checkpoint.State{Extra: map[string]models.Tensor{extraScaler: neg}}, fresh); err == nil {
		t.Error("a growth tracker beyond the interval: no error")
	}
}

// TestSnapshotKeepsLossScaler: a snapshot keeps the loss scaler's state
// bit for bit — after a scripted history, and at the edges (a scale
// backed off to 0 or to a subnormal, +Inf, counts beyond 32 bits) — and
// so do the words it travels in (scalerWords in 16-bit pieces, as the
// broadcast header carries them); a snapshot without a scaler's state
// leaves a scaler as it is.
func TestSnapshotKeepsLossScaler(t *testing.T) {
	spec := recoverySpec(t, "")
	rk := testRing(t, spec, 1, 1, 10, 3)[0]
	s, _ := optim.NewLossScaler(optim.ScalerConfig{GrowthInterval: 3})
	for _, finite := range []bool{true, true, true, false, true, false, true, true} {
		s.Update(finite)
	}
	states := []optim.ScalerState{s.State(),
		{Scale: 0, GrowthTracker: 2},
		{Scale: math.Float32frombits(1), GrowthTracker: 1, Stepped: 1 << 40, Skipped: 150},
		{Scale: float32(math.Inf(1)), Stepped: math.MaxInt64, Skipped: 1<<32 + 5},
	}
	var j jobSnapshots
	for i, want := range states {
		src, _ := optim.NewLossScaler(optim.ScalerConfig{GrowthInterval: 3})
		if err := src.Restore(want); err != nil {
			t.Fatal(err)
		}
		j.take(1, int64(i), 0, 0, rk.net, rk.rs.optim, rk.rs.state, src)
		dst, _ := optim.NewLossScaler(optim.ScalerConfig{GrowthInterval: 3})
		if err := j.latest().restore(rk.net, rk.rs.optim, dst); err != nil {
			t.Fatal(err)
		}
		if got := dst.State(); got != want || math.Float32bits(got.Scale) != math.Float32bits(want.Scale) {
			t.Errorf("state %d: restored %+v, want %+v", i, got, want)
		}
		var hdr [16]float32
		for k, w := range scalerWords(want) {
			putInt64(hdr[4*k:], w)
		}
		var w [4]int64
		for k := range w {
			w[k] = getInt64(hdr[4*k:])
		}
		if got, err := scalerFromWords(w); err != nil || got != want || math.Float32bits(got.Scale) != math.Float32bits(want.Scale) {
			t.Errorf("state %d: through the header words %+v, %v; want %+v", i, got, err, want)
		}
	}
	// a job without a scaler: its snapshots leave one as it is
	j.take(1, 9, 0, 0, rk.net, rk.rs.optim, rk.rs.state, nil)
	if j.latest().scalerSet {
		t.Error("a snapshot taken without a scaler says it holds one")
	}
	if err := j.latest().restore(rk.net, rk.rs.optim, s); err != nil || s.State() != states[0] {
		t.Errorf("a snapshot without a scaler's state: %v, scaler %+v, want %+v", err, s.State(), states[0])
	}
	if _, err := scalerFromWords([4]int64{-1, 0, 0, 0}); err == nil {
		t.Error("scale bits -1: no error")
	}
	if _, err := scalerFromWords([4]int64{0, math.MaxInt32 + 1, 0, 0}); err == nil {
		t.Error("a growth tracker beyond int32: no error")
	}
}

// TestAgreeKeepsLossScaler is TestAgreeRanksOneStepApart with precision
// fp16: the gradients are scaled by the loss scale, rank 1's holds an inf
// at steps 0 and 2 (two back-offs), and the growth interval is 3, so that
// after step 4 the scaler is at 2^14 with one clean step counted — not
// where a fresh one starts. A rank of three is lost after step 5; the new
// generation (two survivors renumbered and a joiner) must restore every
// rank's scaler to its state after step 4 and, after redoing steps 4 and
// 5, hold the scale, growth tracker and counts of an uninterrupted run
// after step 6, with bit-identical parameters.
func TestAgreeKeepsLossScaler(t *testing.T) {
	in := &pb.JobSpec{Model: "mlp", Mode: "ring", Precision: "fp16", Dataset: &pb.DatasetSpec{Name: "synthetic"}, Workers: proto.Int32(3), BatchSize: proto.Int32(8),
		Optimizer: &pb.OptimizerSpec{Name: "sgd", Lr: proto.Float64(0.05), Momentum: proto.Float64(0.9)}}
	spec, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := optim.ScalerConfig{GrowthInterval: 3}
	ring := func(gen uint64, seed0 int64) []*ringRank {
		ranks := testRing(t, spec, 3, gen, 100, seed0)
		for _, rk := range ranks {
			if rk.rs.scaler == nil {
				t.Fatal("test setup: an fp16 ring rank without a loss scaler")
			}
			rk.rs.scaler, _ = optim.NewLossScaler(cfg)
		}
		return ranks
	}
	tr := newTestTrainer(t)
	tr.grads = func(r int, s int64, rk *ringRank, g []float32) {
		scale := rk.rs.lossScale() // backward of loss·scale
		for i := range g {
			g[i] *= scale
		}
		if r == 1 && (s == 0 || s == 2) {
			g[len(g)/2] = float32(math.Inf(1))
		}
	}
	start := func(ranks []*ringRank) {
		onAll(t, ranks, func(ctx context.Context, r int, rk *ringRank) error {
			return rk.rs.broadcastParams(ctx, rk.net.Params())
		})
	}

	// the uninterrupted run: six steps
	ref := ring(1, 3)
	start(ref)
	var after4 optim.ScalerState
	for s := int64(0); s < 6; s++ {
		onAll(t, ref, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
		if s == 3 {
			after4 = ref[0].rs.scaler.State()
		}
	}
	fresh, _ := optim.NewLossScaler(cfg)
	if want := (optim.ScalerState{Scale: 0x1p14, GrowthTracker: 1, Stepped: 2, Skipped: 2}); after4 != want {
		t.Fatalf("test setup: the scaler after step 4 is %+v, want %+v", after4, want)
	}
	if after4 == fresh.State() {
		t.Fatal("test setup: the scaler after step 4 is where a fresh one starts")
	}
	final := ref[0].rs.scaler.State()

	// the same run losing old rank 0 after step 5 (rank 2 did not finish it)
	old := ring(1, 3)
	start(old)
	for s := int64(0); s < 5; s++ {
		onAll(t, old, func(ctx context.Context, r int, rk *ringRank) error {
			if err := tr.step(ctx, rk, r, s); err != nil {
				return err
			}
			if s == 4 && r == 2 {
				return nil
			}
			rk.snaps.take(1, s+1, 0, (s+1)*24, rk.net, rk.rs.optim, rk.rs.state, rk.rs.scaler)
			return nil
		})
	}
	gen2 := ring(2, 50)
	gen2[0].snaps, gen2[1].snaps = old[1].snaps, old[2].snaps
	onAll(t, gen2, func(ctx context.Context, r int, rk *ringRank) error {
		sp, err := rk.rs.agree(ctx, rk.snaps, 2, -1, 5, rk.net)
		if err == nil && (sp.source != fromMemory || sp.step != 4) {
			err = fmt.Errorf("starts from %+v, want memory at step 4", sp)
		}
		return err
	})
	for r, rk := range gen2 {
		if got := rk.rs.scaler.State(); got != after4 {
			t.Errorf("rank %d: the scaler after recovery is %+v, want the state after step 4, %+v", r, got, after4)
		}
	}
	for s := int64(4); s < 6; s++ {
		onAll(t, gen2, func(ctx context.Context, r int, rk *ringRank) error { return tr.step(ctx, rk, r, s) })
	}
	for r, rk := range gen2 {
		if got := rk.rs.scaler.State(); got != final {
			t.Errorf("rank %d: the scaler after step 6 is %+v, an uninterrupted run's %+v", r, got, final)
		}
		if !slices.Equal(rk.net.Params(), ref[0].net.Params()) {
			t.Errorf("rank %d: the parameters after step 6 differ from an uninterrupted run's (max |Δ| %g)", r, maxAbsDiff(rk.net.Params(), ref[0].net.Params()))
		}
	}
}
