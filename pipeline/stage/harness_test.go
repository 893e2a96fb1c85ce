package stage_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
)

// job is a small training problem: a seeded network and batch.
type job struct {
	arch   string
	opt    models.Options
	batch  int
	x      []float32
	labels []uint8
}

func newJob(arch string, batch int, seed uint64) job {
	opt := models.Options{Channels: 1, Height: 12, Width: 12, Classes: 5, Seed: 7}
	if arch == "lenet5" || arch == "cnn" || arch == "resnet8" {
		opt.Height, opt.Width = 28, 28
	}
	if arch == "resnet8" {
		opt.Height, opt.Width = 16, 16
	}
	r := rand.New(rand.NewPCG(seed, 1))
	j := job{arch: arch, opt: opt, batch: batch,
		x: make([]float32, batch*opt.Channels*opt.Height*opt.Width), labels: make([]uint8, batch)}
	for i := range j.x {
		j.x[i] = float32(r.NormFloat64())
	}
	for i := range j.labels {
		j.labels[i] = uint8(r.IntN(opt.Classes))
	}
	return j
}

func (j job) net(t testing.TB) *models.Network {
	t.Helper()
	n, err := models.New(j.arch, j.opt)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const lr = 0.05

// reference trains steps steps on one network the way a worker with
// gradient accumulation over M micro-batches does (worker.forwardBackward
// after clear(grads), SetDropoutCalls(step·M) as the trainer sets it), then
// a plain SGD step; it returns the network and each step's loss.
func reference(t testing.TB, j job, M, steps int) (*models.Network, []float32) {
	net := j.net(t)
	classes := j.opt.Classes
	in := net.InputSize()
	k := j.batch / M
	var losses []float32
	for step := range steps {
		net.ZeroGrad()
		net.SetDropoutCalls(uint64(step) * uint64(M))
		dl := make([]float32, k*classes)
		var loss float64
		for lo := 0; lo < j.batch; lo += k {
			logits := net.Forward(j.x[lo*in:(lo+k)*in], k, true)
			l := models.SoftmaxCrossEntropy(logits, j.labels[lo:lo+k], classes, dl)
			loss += float64(l) * float64(k)
			if k != j.batch {
				w := float32(k) / float32(j.batch)
				for i := range dl {
					dl[i] *= w
				}
			}
			net.Backward(dl)
		}
		losses = append(losses, float32(loss/float64(j.batch)))
		sgd(net.Params(), net.Grads())
	}
	return net, losses
}

func sgd(p, g []float32) {
	for i := range p {
		p[i] -= lr * g[i]
	}
}

// wrapFn may wrap stage s's links (its Prev, then its Next).
type wrapFn func(s int, prev, next stage.Link) (stage.Link, stage.Link)

// pipelineRun is S stages, each with its own network (as on its own
// worker), linked in process.
type pipelineRun struct {
	j      job
	plan   pipeline.Plan
	nets   []*models.Network
	stages [][]models.Stage
	execs  []*stage.Executor
}

func newPipeline(t testing.TB, j job, sched pipeline.Schedule, S, M, capacity int, wrap wrapFn, cost stage.Cost) *pipelineRun {
	t.Helper()
	plan, err := pipeline.New(sched, S, M)
	if err != nil {
		t.Fatal(err)
	}
	p := &pipelineRun{j: j, plan: plan}
	prevs := make([]stage.Link, S)
	nexts := make([]stage.Link, S)
	for s := range S - 1 {
		next, prev := stage.Pipe(s, capacity)
		nexts[s], prevs[s+1] = next, prev
	}
	for s := range S {
		net := j.net(t)
		parts, err := models.Partition(net, S, models.Balance{})
		if err != nil {
			t.Fatal(err)
		}
		prev, next := prevs[s], nexts[s]
		if wrap != nil {
			prev, next = wrap(s, prev, next)
		}
		e, err := stage.New(stage.Config{Net: net, Stages: parts, Stage: s, Plan: plan, Batch: j.batch, Prev: prev, Next: next, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		p.nets, p.stages, p.execs = append(p.nets, net), append(p.stages, parts), append(p.execs, e)
	}
	return p
}

// step runs one step on every stage at once and returns their stats and
// errors.
func (p *pipelineRun) step(ctx context.Context, step int64) ([]stage.Stats, []error) {
	S := len(p.execs)
	stats, errs := make([]stage.Stats, S), make([]error, S)
	classes := p.j.opt.Classes
	k := p.j.batch / p.plan.MicroBatches
	var wg sync.WaitGroup
	for s, e := range p.execs {
		in := stage.Input{}
		if s == 0 {
			in.X = p.j.x
		}
		if s == S-1 {
			in.Loss = func(mb int, logits, dlogits []float32) float32 {
				return models.SoftmaxCrossEntropy(logits, p.j.labels[mb*k:(mb+1)*k], classes, dlogits)
			}
		}
		wg.Go(func() {
			p.nets[s].ZeroGrad()
			stats[s], errs[s] = e.Step(ctx, step, in)
		})
	}
	wg.Wait()
	return stats, errs
}

// sgd steps each stage's own part of its parameters.
func (p *pipelineRun) sgd() {
	for s, n := range p.nets {
		st := p.stages[s][s]
		lo, hi := st.ParamOffset, st.ParamOffset+st.ParamLen
		sgd(n.Params()[lo:hi], n.Grads()[lo:hi])
	}
}

// sameBits reports the first element where a and b differ in their bits.
func sameBits(a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d values, want %d", len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Errorf("[%d] = %v, want %v", i, a[i], b[i])
		}
	}
	return nil
}
