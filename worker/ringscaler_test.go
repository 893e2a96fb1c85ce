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
