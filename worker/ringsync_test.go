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
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestRingAndPSMatchSingleWorker trains the same model on the same global
// batches three ways — one worker, two ranks over a ring, two ranks through
// the synchronous parameter-server shard — and checks that the parameters
// agree after 20 steps.
func TestRingAndPSMatchSingleWorker(t *testing.T) {
	const (
		steps  = 20
		global = 32
		world  = 2
	)
	train, _, err := data.Synthetic(global*steps, 10, 7)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: &pb.DatasetSpec{Name: "synthetic"},
		Workers: proto.Int32(world), BatchSize: proto.Int32(global / world),
		BucketCapMb: 0.1}, nil) // several buckets, so that the overlapped run really overlaps
	if err != nil {
		t.Fatal(err)
	}
	newNet := func() *models.Network {
		n, err := models.New("mlp", models.Options{Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	newSGD := func() *optim.SGD {
		o := spec.Optimizer
		return &optim.SGD{LR: float32(o.GetLr()), Momentum: float32(o.GetMomentum())}
	}
	// grad computes net's mean gradient over examples [lo, hi) of the step;
	// gradNotify does so reporting backward's progress to ready.
	var gradNotify func(net *models.Network, step, lo, hi int, ready func(int)) []float32
	grad := func(net *models.Network, step, lo, hi int) []float32 { return gradNotify(net, step, lo, hi, nil) }
	gradNotify = func(net *models.Network, step, lo, hi int, ready func(int)) []float32 {
		idx := make([]int, hi-lo)
		for i := range idx {
			idx[i] = step*global + lo + i
		}
		x := make([]float32, len(idx)*net.InputSize())
		y := make([]int32, len(idx))
		train.Batch(idx, x, y)
		net.ZeroGrad()
		logits := net.Forward(x, len(idx), true)
		dl := make([]float32, len(logits))
		models.SoftmaxCrossEntropy(logits, y, 10, dl)
		net.BackwardNotify(dl, ready)
		return net.Grads()
	}

	// One worker, the whole global batch.
	single := newNet()
	sgd := newSGD()
	for s := 0; s < steps; s++ {
		g := grad(single, s, 0, global)
		sgd.SetLR(float32(optim.LearningRate(spec, int64(s), steps)))
		sgd.Step(single.Params(), g)
	}

	// Two ranks through the PS shard.
	psNets := []*models.Network{newNet(), newNet()}
	shardOpt := newSGD()
	shard := aggregator.NewSyncShard(append([]float32(nil), psNets[0].Params()...), world, shardOpt, false)
	for s := 0; s < steps; s++ {
		shardOpt.SetLR(float32(optim.LearningRate(spec, int64(s), steps)))
		for r, net := range psNets {
			g := grad(net, s, r*global/world, (r+1)*global/world)
			if _, err := shard.Add(r, int64(s), 0, len(g), func(dst []float32) error {
				for i := range dst {
					dst[i] += g[i]
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		for _, net := range psNets {
			copy(net.Params(), shard.Params())
		}
	}

	// Two ranks over an in-memory ring, reducing after backward, then
	// overlapping the bucket all-reduces with backward (beginStep).
	a := &pb.Assignment{Generation: 1, Spec: spec}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runRing := func(overlap bool) []*models.Network {
		rings := aggregator.NewMemRing(world, 4)
		nets := []*models.Network{newNet(), newNet()}
		var wg sync.WaitGroup
		errs := make([]error, world)
		for r := range world {
			wg.Go(func() {
				net := nets[r]
				rs, err := newRingSync(ctx, rings[r], nil, a, net, steps, nil)
				if err != nil {
					errs[r] = err
					return
				}
				rs.noOverlap = !overlap
				if err := rs.broadcastParams(ctx, net.Params()); err != nil {
					errs[r] = err
					return
				}
				for s := 0; s < steps; s++ {
					net.ZeroGrad()
					ready, err := rs.beginStep(ctx, net.Grads())
					if err != nil {
						errs[r] = err
						return
					}
					if overlap == (ready == nil) {
						errs[r] = fmt.Errorf("overlap %v but beginStep returned ready = %v", overlap, ready != nil)
						return
					}
					g := gradNotify(net, s, r*global/world, (r+1)*global/world, ready)
					if err := rs.step(ctx, g, net.Params()); err != nil {
						errs[r] = err
						return
					}
				}
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("ring rank %d (overlap %v): %v", r, overlap, err)
			}
		}
		return nets
	}
	ringNets := runRing(false)
	overlapped := runRing(true)
	for r := range world {
		if !slices.Equal(overlapped[r].Params(), ringNets[r].Params()) {
			t.Fatalf("rank %d: overlapped all-reduce gives other parameters than all-reduce after backward", r)
		}
	}

	want := single.Params()
	check := func(name string, got []float32) {
		t.Helper()
		var maxDiff, maxAbs float64
		for i := range want {
			maxDiff = math.Max(maxDiff, math.Abs(float64(got[i]-want[i])))
			maxAbs = math.Max(maxAbs, math.Abs(float64(want[i])))
		}
		if maxDiff > 1e-4*math.Max(1, maxAbs) {
			t.Errorf("%s: parameters differ from single-worker training by up to %g", name, maxDiff)
		}
	}
	check("ps rank 0", psNets[0].Params())
	check("ring rank 0", ringNets[0].Params())
	check("ring rank 1", ringNets[1].Params())
	for i := range ringNets[0].Params() {
		if ringNets[0].Params()[i] != ringNets[1].Params()[i] {
			t.Fatalf("ring ranks differ at parameter %d", i)
		}
	}
}
