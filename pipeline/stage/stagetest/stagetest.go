// Package stagetest is the suite that checks pipeline stages against one
// worker, shared by every Link implementation's tests (in process, gRPC):
// a seeded job, the reference one worker trains it with, and S executors
// run over the links a test provides.
package stagetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
)

// Job is a small seeded training problem: an architecture and one batch.
type Job struct {
	Arch   string
	Opt    models.Options
	Batch  int
	X      []float32 // Batch × C×H×W
	Labels []uint8
}

// NewJob is arch on a batch of random images and labels drawn from seed
// (5 classes; 12×12 for mlp, 16×16 for resnet8, 28×28 otherwise).
func NewJob(arch string, batch int, seed uint64) Job {
	opt := models.Options{Channels: 1, Height: 28, Width: 28, Classes: 5, Seed: 7}
	switch arch {
	case "mlp":
		opt.Height, opt.Width = 12, 12
	case "resnet8":
		opt.Height, opt.Width = 16, 16
	}
	r := rand.New(rand.NewPCG(seed, 1))
	j := Job{Arch: arch, Opt: opt, Batch: batch,
		X: make([]float32, batch*opt.Channels*opt.Height*opt.Width), Labels: make([]uint8, batch)}
	for i := range j.X {
		j.X[i] = float32(r.NormFloat64())
	}
	for i := range j.Labels {
		j.Labels[i] = uint8(r.IntN(opt.Classes))
	}
	return j
}

// Net builds the job's network, the same on every call.
func (j Job) Net(t testing.TB) *models.Network {
	t.Helper()
	n, err := models.New(j.Arch, j.Opt)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// LR is the learning rate of SGD.
const LR = 0.05

// SGD steps p by −LR·g.
func SGD(p, g []float32) {
	for i := range p {
		p[i] -= LR * g[i]
	}
}

// Reference trains steps steps on one network the way a worker with
// gradient accumulation over M micro-batches does (worker.forwardBackward
// after clearing the gradients, with SetDropoutCalls(step·M) as the
// trainer sets it), each followed by SGD; it returns the network, holding
// the last step's gradients, and each step's loss.
func Reference(t testing.TB, j Job, M, steps int) (*models.Network, []float32) {
	net := j.Net(t)
	classes := j.Opt.Classes
	in := net.InputSize()
	k := j.Batch / M
	var losses []float32
	for step := range steps {
		net.ZeroGrad()
		net.SetDropoutCalls(uint64(step) * uint64(M))
		dl := make([]float32, k*classes)
		var loss float64
		for lo := 0; lo < j.Batch; lo += k {
			logits := net.Forward(j.X[lo*in:(lo+k)*in], k, true)
			l := models.SoftmaxCrossEntropy(logits, j.Labels[lo:lo+k], classes, dl)
			loss += float64(l) * float64(k)
			if k != j.Batch {
				w := float32(k) / float32(j.Batch)
				for i := range dl {
					dl[i] *= w
				}
			}
			net.Backward(dl)
		}
		losses = append(losses, float32(loss/float64(j.Batch)))
		SGD(net.Params(), net.Grads())
	}
	return net, losses
}

// Pipeline is S stages of a job, each with its own network (as on its
// own worker), over links the caller made.
type Pipeline struct {
	Job    Job
	Plan   pipeline.Plan
	Nets   []*models.Network
	Stages [][]models.Stage // Stages[s] is stage s's partition of Nets[s]
	Execs  []*stage.Executor
}

// New builds stage s's executor over prev[s] and next[s] (nil where the
// stage has no such neighbour), partitioning by parameters.
func New(t testing.TB, j Job, plan pipeline.Plan, prev, next []stage.Link, cost stage.Cost) *Pipeline {
	t.Helper()
	p := &Pipeline{Job: j, Plan: plan}
	for s := range plan.Stages {
		net := j.Net(t)
		parts, err := models.Partition(net, plan.Stages, models.Balance{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := stage.New(stage.Config{Net: net, Stages: parts, Stage: s, Plan: plan, Batch: j.Batch, Prev: prev[s], Next: next[s], Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		p.Nets, p.Stages, p.Execs = append(p.Nets, net), append(p.Stages, parts), append(p.Execs, e)
	}
	return p
}

// Step clears every stage's gradients and runs one step on all stages at
// once, each on its own goroutine; it returns their stats and errors.
func (p *Pipeline) Step(ctx context.Context, step int64) ([]stage.Stats, []error) {
	S := len(p.Execs)
	stats, errs := make([]stage.Stats, S), make([]error, S)
	classes := p.Job.Opt.Classes
	k := p.Job.Batch / p.Plan.MicroBatches
	var wg sync.WaitGroup
	for s, e := range p.Execs {
		in := stage.Input{}
		if s == 0 {
			in.X = p.Job.X
		}
		if s == S-1 {
			in.Loss = func(mb int, logits, dlogits []float32) float32 {
				return models.SoftmaxCrossEntropy(logits, p.Job.Labels[mb*k:(mb+1)*k], classes, dlogits)
			}
		}
		wg.Go(func() {
			p.Nets[s].ZeroGrad()
			stats[s], errs[s] = e.Step(ctx, step, in)
		})
	}
	wg.Wait()
	return stats, errs
}

// SGD steps each stage's own part of its parameters.
func (p *Pipeline) SGD() {
	for s, n := range p.Nets {
		lo, hi := p.params(s)
		SGD(n.Params()[lo:hi], n.Grads()[lo:hi])
	}
}

func (p *Pipeline) params(s int) (lo, hi int) {
	st := p.Stages[s][s]
	return st.ParamOffset, st.ParamOffset + st.ParamLen
}

// CompareGrads says where a stage's gradients first differ from ref's
// in their bits, or returns nil.
func (p *Pipeline) CompareGrads(ref *models.Network) error {
	for s, n := range p.Nets {
		lo, hi := p.params(s)
		if err := SameBits(n.Grads()[lo:hi], ref.Grads()[lo:hi]); err != nil {
			return fmt.Errorf("stage %d gradients: %w", s, err)
		}
	}
	return nil
}

// CompareState says where a stage's parameters or batch-norm buffers
// first differ from ref's in their bits, or returns nil.
func (p *Pipeline) CompareState(ref *models.Network) error {
	for s, n := range p.Nets {
		lo, hi := p.params(s)
		if err := SameBits(n.Params()[lo:hi], ref.Params()[lo:hi]); err != nil {
			return fmt.Errorf("stage %d parameters: %w", s, err)
		}
		st := p.Stages[s][s]
		blo, bhi := st.BufferOffset, st.BufferOffset+st.BufferLen
		if err := SameBits(n.Buffers()[blo:bhi], ref.Buffers()[blo:bhi]); err != nil {
			return fmt.Errorf("stage %d buffers: %w", s, err)
		}
	}
	return nil
}

// SameBits reports the first element where a and b differ in their bits.
func SameBits(a, b []float32) error {
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

// ErrKilled is the error of a Tripwire's transfers once it has fired.
var ErrKilled = errors.New("stagetest: killed")

// Tripwire makes a stage die mid-step: it wraps the stage's links, and
// at their K-th transfer (counting both links' Sends and Recvs from 0)
// it calls Fire — which ends the stage as a dying process would: aborting
// its links, stopping its server — and fails that transfer and every
// later one with ErrKilled.
type Tripwire struct {
	K    int
	Fire func()

	mu  sync.Mutex // protects ops
	ops int
}

func (w *Tripwire) tick() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ops++
	if w.ops == w.K+1 {
		w.Fire()
	}
	if w.ops > w.K {
		return ErrKilled
	}
	return nil
}

// Wrap returns l behind the tripwire (nil for nil).
func (w *Tripwire) Wrap(l stage.Link) stage.Link {
	if l == nil {
		return nil
	}
	return tripped{w, l}
}

type tripped struct {
	w *Tripwire
	stage.Link
}

func (t tripped) Send(ctx context.Context, h stage.Header, data []float32) error {
	if err := t.w.tick(); err != nil {
		return err
	}
	return t.Link.Send(ctx, h, data)
}

func (t tripped) Recv(ctx context.Context, want stage.Header, dst []float32) error {
	if err := t.w.tick(); err != nil {
		return err
	}
	return t.Link.Recv(ctx, want, dst)
}

// Infer evaluates the first n samples of the job's batch through the
// pipeline (Executor.Infer on every stage at once) and returns the
// logits, n × classes, and the stages' errors.
func (p *Pipeline) Infer(ctx context.Context, pass int64, n int) ([]float32, []error) {
	S := len(p.Execs)
	classes := p.Job.Opt.Classes
	logits := make([]float32, n*classes)
	errs := make([]error, S)
	in := p.Nets[0].InputSize()
	var wg sync.WaitGroup
	for s, e := range p.Execs {
		var x []float32
		if s == 0 {
			x = p.Job.X[:n*in]
		}
		var out func(lo int, y []float32)
		if s == S-1 {
			out = func(lo int, y []float32) { copy(logits[lo*classes:], y) }
		}
		wg.Go(func() { errs[s] = e.Infer(ctx, pass, n, x, out) })
	}
	wg.Wait()
	return logits, errs
}

// ReferenceInfer is ref's evaluation of the first n samples of the
// job's batch in micro-batches of k samples (the last one shorter).
func ReferenceInfer(ref *models.Network, j Job, n, k int) []float32 {
	classes, in := j.Opt.Classes, ref.InputSize()
	logits := make([]float32, n*classes)
	for lo := 0; lo < n; lo += k {
		m := min(k, n-lo)
		copy(logits[lo*classes:], ref.Forward(j.X[lo*in:(lo+m)*in], m, false))
	}
	return logits
}

// Jitter returns l (nil for nil) delayed by a random time in [0, max],
// drawn from seed, before each of its transfers, to shake the stages'
// relative timing.
func Jitter(l stage.Link, seed uint64, max time.Duration) stage.Link {
	if l == nil {
		return nil
	}
	return &jitter{Link: l, r: rand.New(rand.NewPCG(seed, 0x6a17)), max: max}
}

type jitter struct {
	stage.Link
	r   *rand.Rand // used by the stage's goroutine only
	max time.Duration
}

func (l *jitter) pause() { time.Sleep(time.Duration(l.r.Int64N(int64(l.max) + 1))) }

func (l *jitter) Send(ctx context.Context, h stage.Header, data []float32) error {
	l.pause()
	return l.Link.Send(ctx, h, data)
}

func (l *jitter) Recv(ctx context.Context, want stage.Header, dst []float32) error {
	l.pause()
	return l.Link.Recv(ctx, want, dst)
}
