package models

import (
	"fmt"
	"math"
	"sync"

	"github.com/gradsync/gradsync/internal/kernels"
)

// One worker's step on several cores (SetThreads): the batch is cut into
// T contiguous slices, one per thread. Thread 0 is the network's own
// layers on the caller's goroutine; threads 1…T−1 are replicas, each a
// second build of the architecture whose parameter views point into the
// network's one parameter buffer but which has its own activations and
// its own gradient buffer, run by a goroutine the network owns. Backward
// adds thread 0's gradients straight into Grads, as with one thread, then
// the replicas' buffers in thread order, so that for a given T every sum
// is made in the same order and a step's result is deterministic. With
// Batch norm's copies meet at barriers to share the whole batch's
// statistics (bnGroup). With T = 1 nothing of this runs: Forward and Backward are the one-thread
// code, bit for bit.

// replica is one more thread's copy of the layers.
type replica struct {
	layers   []Layer
	grads    []float32 // this thread's gradients, cleared before each Backward
	dropouts []*Dropout
	out      []float32 // the last Forward's logits of this slice
	ck       *stackCk  // its checkpointing state (SetCheckpointing)

	jobs   chan job      // closed by stopThreads
	done   chan struct{} // one per finished Forward
	prog   chan int      // Backward's progress: i once layer i is done, −1 at the end
	exited chan struct{} // closed when the goroutine returns
	pos    int           // the last progress value the network received
}

// job is one Forward or Backward of a replica's slice, or one share of
// the sum of the threads' gradients.
type job struct {
	op    jobOp
	x     []float32 // Forward's input, Backward's dlogits, or the part of Grads to sum into
	batch int       // Forward: samples in x; sum: x's offset in Grads
	train bool
	reps  []*replica // sum: the replicas to add, in thread order
}

type jobOp uint8

const (
	opForward jobOp = iota
	opBackward
	opSum
)

func (r *replica) run() {
	defer close(r.exited)
	for j := range r.jobs {
		if j.op == opSum {
			addGrads(j.x, j.reps, j.batch)
			r.done <- struct{}{}
			continue
		}
		if j.op == opForward {
			r.out = forwardLayers(r.layers, r.ck, j.x, j.batch, j.train)
			r.done <- struct{}{}
			continue
		}
		clear(r.grads)
		backwardLayers(r.layers, r.ck, j.x, func(i int) {
			r.prog <- i // never blocks: prog holds a whole Backward's messages
		})
		r.prog <- -1
	}
}

// SetThreads makes Forward and Backward run each batch on t goroutines
// (default 1), each on a contiguous slice of the batch; the caller's is
// one of them. Results are deterministic for a given t and equal, up to
// float32 rounding of the reordered sums, to those of one thread; every
// sample's dropout mask is the one it gets with one thread. Each thread
// makes its own GEMM calls, so OpenBLAS should keep one thread per call
// (kernels.SetThreads(1), its default). Batch norm still normalises over
// the whole batch: its threads exchange partial sums. The goroutines run
// until Close or SetThreads(1); it must not be called during a step.
func (n *Network) SetThreads(t int) error {
	if t < 1 {
		return fmt.Errorf("models: %s: %d threads, want at least 1", n.name, t)
	}
	if t == len(n.reps)+1 || n.part != nil {
		return nil
	}
	n.stopThreads()
	if t == 1 {
		return nil
	}
	n.bnGroups = make([]*bnGroup, len(n.bns))
	for i, l := range n.bns {
		n.bnGroups[i] = newBNGroup(t, l.C)
		l.group, l.thread = n.bnGroups[i], 0
	}
	a := archs[n.name]
	for range t - 1 {
		b := builder{seed: uint64(n.opt.Seed)}
		layers, _ := a(&b, n.opt) // the initialiser is not run: the parameters are the network's
		r := &replica{
			layers:   layers,
			grads:    make([]float32, b.n),
			dropouts: b.dropouts,
			jobs:     make(chan job, 1),
			done:     make(chan struct{}, 1),
			prog:     make(chan int, len(layers)+1),
			exited:   make(chan struct{}),
		}
		b.bind(n.params, r.grads, n.bufs)
		r.ck = n.newStackCk(layers)
		setPrecision(layers, n.prec)
		for i, d := range r.dropouts {
			d.calls = n.dropouts[i].calls
		}
		for i, l := range b.bns {
			l.group, l.thread = n.bnGroups[i], len(n.reps)+1
		}
		n.reps = append(n.reps, r)
		go r.run()
	}
	n.split = make([]int, t+1)
	return nil
}

// Threads reports the thread count set by SetThreads.
func (n *Network) Threads() int { return len(n.reps) + 1 }

// Close stops the goroutines SetThreads started and waits for them; the
// network runs on one thread afterwards. It is safe to call more than once.
func (n *Network) Close() { n.stopThreads() }

func (n *Network) stopThreads() {
	for _, r := range n.reps {
		close(r.jobs)
	}
	for _, r := range n.reps {
		<-r.exited
	}
	for _, l := range n.bns {
		l.group = nil
	}
	n.reps, n.split, n.logits, n.bnGroups = nil, nil, nil, nil
}

// forwardSplit is Forward on the threads: slice k holds samples
// [split[k], split[k+1]), the first batch%T slices one sample more than
// the others; with fewer samples than threads the last threads idle.
func (n *Network) forwardSplit(x []float32, batch int, train bool) []float32 {
	t := min(len(n.reps)+1, batch)
	n.active = t
	q, rem := batch/t, batch%t
	n.split[0] = 0
	for k := range t {
		n.split[k+1] = n.split[k] + q
		if k < rem {
			n.split[k+1]++
		}
	}
	for _, g := range n.bnGroups {
		g.n, g.batch = t, batch
	}
	in := n.InputSize()
	for k := 1; k < t; k++ {
		r := n.reps[k-1]
		lo, hi := n.split[k], n.split[k+1]
		for _, d := range r.dropouts {
			d.first = lo
		}
		r.jobs <- job{op: opForward, x: x[lo*in : hi*in], batch: hi - lo, train: train}
	}
	y := forwardLayers(n.layers, n.ck, x[:n.split[1]*in], n.split[1], train)
	c := n.opt.Classes
	n.logits = grow(n.logits, batch*c)
	copy(n.logits, y)
	for k := 1; k < t; k++ {
		r := n.reps[k-1]
		<-r.done
		copy(n.logits[n.split[k]*c:], r.out)
	}
	if t < len(n.reps)+1 {
		// idle threads draw no masks: keep their dropout counters in step
		for _, r := range n.reps[t-1:] {
			for _, d := range r.dropouts {
				if train && d.P > 0 {
					d.calls++
				}
			}
		}
	}
	return n.logits
}

// backwardSplit is backward on the threads. With ready set, the range of
// Grads that every thread has finished is summed, and ready called, after
// each layer, so that communication starts as early as with one thread.
func (n *Network) backwardSplit(dlogits []float32, ready func(from int)) {
	c := n.opt.Classes
	for k := 1; k < n.active; k++ {
		r := n.reps[k-1]
		r.pos = len(r.layers)
		r.jobs <- job{op: opBackward, x: dlogits[n.split[k]*c : n.split[k+1]*c]}
	}
	if ready != nil && n.ready == nil {
		n.ready = n.readyOffsets()
	}
	hi := len(n.grads)
	var done func(i int)
	if ready != nil {
		done = func(i int) {
			n.await(i)
			lo := n.ready[i]
			addGrads(n.grads[lo:hi], n.reps[:n.active-1], lo) // the replicas are mid-Backward: sum here
			hi = lo
			ready(lo)
		}
	}
	backwardLayers(n.layers, n.ck, dlogits[:n.split[1]*c], done)
	n.await(-1)
	n.sumGrads(0, hi)
	if ready != nil {
		ready(0)
	}
}

// await waits until every active replica has finished layer i of its
// Backward (i = −1: all of it).
func (n *Network) await(i int) {
	for _, r := range n.reps[:n.active-1] {
		for r.pos > i {
			r.pos = <-r.prog
		}
	}
}

// parallelSum is the range of Grads from which sumGrads shares the sum
// out among the threads (below it, handing the shares over costs more
// than it saves).
const parallelSum = 1 << 15

// sumGrads adds the active replicas' gradients over [lo, hi) into Grads,
// in thread order, once every replica has finished its Backward. A large
// range is cut into one share per thread (on 64-byte boundaries); each
// element is summed in the same order either way, so the result does not
// depend on the cut.
func (n *Network) sumGrads(lo, hi int) {
	reps := n.reps[:n.active-1]
	if hi-lo < parallelSum || n.active < 2 {
		addGrads(n.grads[lo:hi], reps, lo)
		return
	}
	share := ((hi-lo)/n.active + 15) &^ 15
	for k := 1; k < n.active; k++ {
		a := min(lo+k*share, hi)
		b := min(a+share, hi)
		reps[k-1].jobs <- job{op: opSum, x: n.grads[a:b], batch: a, reps: reps}
	}
	addGrads(n.grads[lo:min(lo+share, hi)], reps, lo)
	for _, r := range reps {
		<-r.done
	}
}

// addGrads adds reps' gradients from offset lo on into dst, in order.
func addGrads(dst []float32, reps []*replica, lo int) {
	for _, r := range reps {
		src := r.grads[lo : lo+len(dst)]
		for j := range dst {
			dst[j] += src[j]
		}
	}
}

// bnGroup is what the threads' copies of one batch-norm layer share so
// that, as with one thread, each channel is normalised with the whole
// batch's statistics: every thread writes its slice's partial sums into
// its own row, all meet at a barrier, and every thread then adds the rows
// in thread order, so all get the same totals.
type bnGroup struct {
	mu      sync.Mutex
	cond    sync.Cond
	n       int // threads taking part in this step
	batch   int // the whole batch
	arrived int
	phase   uint64
	parts   [][]float64 // per thread: Σx, Σ(x−μ)², Σdy, Σdy·x̂, C each
}

func newBNGroup(threads, c int) *bnGroup {
	g := &bnGroup{parts: make([][]float64, threads)}
	g.cond.L = &g.mu
	for k := range g.parts {
		g.parts[k] = make([]float64, 4*c)
	}
	return g
}

// wait returns once all n threads have called it; what each wrote
// before is then visible to all.
func (g *bnGroup) wait() {
	g.mu.Lock()
	defer g.mu.Unlock()
	ph := g.phase
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.phase++
		g.cond.Broadcast()
		return
	}
	for ph == g.phase {
		g.cond.Wait()
	}
}

// total is Σ_k parts[k][off+c] over the step's threads, in thread order.
func (g *bnGroup) total(off, c int) float64 {
	var s float64
	for _, p := range g.parts[:g.n] {
		s += p[off+c]
	}
	return s
}

// forwardGroup is training Forward with the whole batch's statistics:
// the same two float64 passes as one thread, each split into per-thread
// partial sums. Only thread 0 moves the running statistics.
func (l *BatchNorm2d) forwardGroup(x []float32) {
	g, hw, batch, cc := l.group, l.hw, l.batch, l.C
	part := g.parts[l.thread]
	for c := range cc {
		var s kernels.Acc64
		for n := range batch {
			s.AddF32(x[(n*cc+c)*hw : (n*cc+c+1)*hw])
		}
		part[c] = s.Sum()
	}
	g.wait()
	m := g.batch * hw
	for c := range cc {
		mu := g.total(0, c) / float64(m)
		var ss kernels.Acc64
		for n := range batch {
			ss.AddSqDev(x[(n*cc+c)*hw:(n*cc+c+1)*hw], mu)
		}
		part[cc+c] = ss.Sum()
	}
	g.wait()
	for c := range cc {
		mu := g.total(0, c) / float64(m)
		ss := g.total(cc, c)
		variance := ss / float64(m)
		mean := float32(mu)
		inv := float32(1 / math.Sqrt(variance+float64(l.Eps)))
		if l.thread == 0 {
			unbiased := variance
			if m > 1 {
				unbiased = ss / float64(m-1)
			}
			mo := l.Momentum
			l.RunningMean[c] = (1-mo)*l.RunningMean[c] + mo*mean
			l.RunningVar[c] = (1-mo)*l.RunningVar[c] + mo*float32(unbiased)
		}
		l.stats[c], l.stats[cc+c] = mean, inv
		l.normalize(x, c, mean, inv)
	}
}

// backwardGroup is Backward with the whole batch's sums of dy and dy·x̂;
// thread 0 adds them to dγ and dβ, so that the threads' gradients sum to
// them once.
func (l *BatchNorm2d) backwardGroup(dy []float32) {
	g, hw, batch, cc := l.group, l.hw, l.batch, l.C
	part := g.parts[l.thread]
	for c := range cc {
		var sdy, sdyx kernels.Acc64
		for n := range batch {
			off := (n*cc + c) * hw
			sdy.AddDot(&sdyx, l.gatedDy(dy, off), l.xhat[off:off+hw])
		}
		part[2*cc+c], part[3*cc+c] = sdy.Sum(), sdyx.Sum()
	}
	g.wait()
	m := float64(g.batch * hw)
	for c := range cc {
		sdy, sdyx := g.total(2*cc, c), g.total(3*cc, c)
		if l.thread == 0 {
			l.DWeight[c] += float32(sdyx)
			l.DBias[c] += float32(sdy)
		}
		k := l.Weight[c] * l.invStd[c]
		var meanDy, meanDyx float32
		if l.train {
			meanDy, meanDyx = float32(sdy/m), float32(sdyx/m)
		}
		for n := range batch {
			off := (n*cc + c) * hw
			dx := l.dx[off : off+hw]
			d := dy[off : off+hw]
			if l.ReLU {
				d = dx // gated in the first pass
			}
			kernels.BNInputGrad(dx, d, l.xhat[off:off+hw], k, meanDy, meanDyx)
		}
	}
}
