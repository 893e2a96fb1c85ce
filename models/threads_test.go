package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
)

// threadStep runs one training step of n on a fixed batch with its
// dropout rewound, and returns copies of the logits and gradients.
func threadStep(n *Network, x []float32, labels []uint8, batch int) (logits, grads []float32) {
	c := n.Options().Classes
	d := make([]float32, batch*c)
	n.ZeroGrad()
	n.rewindDropout()
	y := n.Forward(x, batch, true)
	SoftmaxCrossEntropy(y, labels, c, d)
	logits = slices.Clone(y)
	n.Backward(d)
	return logits, slices.Clone(n.Grads())
}

func threadBatch(n *Network, batch int) ([]float32, []uint8) {
	r := rand.New(rand.NewPCG(3, 5))
	x := randn(r, batch*n.InputSize())
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(r.IntN(n.Options().Classes))
	}
	return x, labels
}

// maxDiff is max_j |a_j − b_j| / max(‖a‖∞, tiny).
func maxDiff(a, b []float32) float64 {
	var d, m float64
	for j := range a {
		d = max(d, math.Abs(float64(a[j])-float64(b[j])))
		m = max(m, math.Abs(float64(a[j])))
	}
	return d / max(m, 1e-30)
}

// TestThreadsMatchOneThread checks, on every architecture, that T = 2 and
// 3 threads give the one-thread logits and gradients up to float32
// reassociation, and the same ones on every run for a given T. A
// gradient element is a sum of B per-sample terms; the threads regroup it
// into T partial sums, which moves it by at most about B·ε·Σ|terms|
// (ε = 2⁻²³). Σ|terms| is not at hand, so the bound is stated against
// ‖g‖∞: |Δg_j| ≤ 32·B·ε·‖g‖∞ ≈ 5e-5·‖g‖∞ for B = 13 (measured: at most
// 3e-7·‖g‖∞, on vit-tiny); the logits, which the threads compute per
// sample, are held to the same bound. Dropout is on: its masks do not
// depend on T, so they cannot explain a difference. Batch 13 makes the
// slices uneven and their dropout offsets not multiples of 64. Batch
// norm (resnet8) shares the whole batch's statistics across the threads,
// so its running statistics are checked too.
func TestThreadsMatchOneThread(t *testing.T) {
	t.Parallel() // as its architectures: each builds its own networks
	const batch = 13
	const bound = batch * 0x1p-23 * 32
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opt := testOptions(name, Options{Seed: 2})
			one, _ := New(name, opt)
			x, labels := threadBatch(one, batch)
			wantY, wantG := threadStep(one, x, labels, batch)
			wantB := slices.Clone(one.Buffers())
			for _, threads := range []int{2, 3} {
				n, _ := New(name, opt)
				if err := n.SetThreads(threads); err != nil {
					t.Fatalf("%s: SetThreads(%d): %v", name, threads, err)
				}
				y, g := threadStep(n, x, labels, batch)
				if d := maxDiff(wantB, n.Buffers()); len(wantB) > 0 && d > bound {
					t.Errorf("%s, %d threads: batch norm's running statistics differ by %.3g, want ≤ %.3g", name, threads, d, bound)
				}
				if d := maxDiff(wantY, y); d > bound {
					t.Errorf("%s, %d threads: logits differ by %.3g·‖y‖∞, want ≤ %.3g", name, threads, d, bound)
				}
				if d := maxDiff(wantG, g); d > bound {
					t.Errorf("%s, %d threads: gradients differ by %.3g·‖g‖∞, want ≤ %.3g", name, threads, d, bound)
				} else {
					t.Logf("%s, %d threads: gradients within %.3g·‖g‖∞", name, threads, d)
				}
				y2, g2 := threadStep(n, x, labels, batch)
				if !slices.Equal(y, y2) || !slices.Equal(g, g2) {
					t.Errorf("%s, %d threads: a second run differs, want bit-identical", name, threads)
				}
				n.Close()
			}
		})
	}
}

// TestThreadsOneIsToday checks that SetThreads(1), also after more
// threads, leaves the one-thread step bit for bit.
func TestThreadsOneIsToday(t *testing.T) {
	const batch = 5
	a, _ := New("cnn", Options{Seed: 4})
	b, _ := New("cnn", Options{Seed: 4})
	x, labels := threadBatch(a, batch)
	wantY, wantG := threadStep(a, x, labels, batch)
	if err := b.SetThreads(3); err != nil {
		t.Fatal(err)
	}
	threadStep(b, x, labels, batch)
	if err := b.SetThreads(1); err != nil {
		t.Fatal(err)
	}
	y, g := threadStep(b, x, labels, batch)
	if !slices.Equal(wantY, y) || !slices.Equal(wantG, g) {
		t.Error("one thread after three differs from one thread, want bit-identical")
	}
	if err := b.SetThreads(0); err == nil {
		t.Error("SetThreads(0) succeeded, want an error")
	}
}

// TestThreadsSmallBatch runs a batch smaller than the thread count: the
// idle threads must not break the step, the dropout counters or batch
// norm's barriers.
func TestThreadsSmallBatch(t *testing.T) {
	for _, name := range []string{"cnn", "resnet8"} {
		threadsSmallBatch(t, name)
	}
}

func threadsSmallBatch(t *testing.T, name string) {
	a, _ := New(name, Options{Seed: 4})
	b, _ := New(name, Options{Seed: 4})
	if err := b.SetThreads(3); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, batch := range []int{2, 1, 7} {
		x, labels := threadBatch(a, batch)
		wantY, wantG := threadStep(a, x, labels, batch)
		y, g := threadStep(b, x, labels, batch)
		if d := maxDiff(wantY, y); d > 1e-5 {
			t.Errorf("%s, batch %d: logits differ by %.3g", name, batch, d)
		}
		if d := maxDiff(wantG, g); d > 1e-5 {
			t.Errorf("%s, batch %d: gradients differ by %.3g", name, batch, d)
		}
	}
}

// TestThreadsBackwardNotify checks the readiness contract on the threads:
// from only decreases and ends at 0, grads[from:] is final when ready(from)
// is called, and the gradients are Backward's bit for bit.
func TestThreadsBackwardNotify(t *testing.T) {
	const batch = 9
	for _, name := range []string{"mlp", "lenet5", "cnn", "resnet8", "vit-tiny"} {
		n, _ := New(name, Options{Seed: 3})
		if err := n.SetThreads(2); err != nil {
			t.Fatal(err)
		}
		x, labels := threadBatch(n, batch)
		_, want := threadStep(n, x, labels, batch)

		c := n.Options().Classes
		d := make([]float32, batch*c)
		n.ZeroGrad()
		n.rewindDropout()
		SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, c, d)
		type snap struct {
			from int
			tail []float32
		}
		var snaps []snap
		n.BackwardNotify(d, func(from int) {
			snaps = append(snaps, snap{from, slices.Clone(n.Grads()[from:])})
		})
		if !slices.Equal(n.Grads(), want) {
			t.Errorf("%s: BackwardNotify's gradients differ from Backward's", name)
		}
		if len(snaps) == 0 || snaps[len(snaps)-1].from != 0 {
			t.Fatalf("%s: ready's last from is not 0 (%d calls)", name, len(snaps))
		}
		prev := len(want)
		for _, s := range snaps {
			if s.from > prev {
				t.Errorf("%s: from rose from %d to %d", name, prev, s.from)
			}
			prev = s.from
			if !slices.Equal(s.tail, want[s.from:]) {
				t.Errorf("%s: grads[%d:] changed after ready(%d)", name, s.from, s.from)
			}
		}
		n.Close()
	}
}

// TestDropoutSliceMasks checks that a dropout layer given the batch in
// slices (as the threads do) applies each value the mask it gets in the
// whole batch, also when the slices start inside a 64-value word.
func TestDropoutSliceMasks(t *testing.T) {
	const batch, per = 11, 7 // 77 values: slices start at 0, 21, 49
	r := rand.New(rand.NewPCG(1, 1))
	x := randn(r, batch*per)
	whole := NewDropout(0.5, 99)
	want := slices.Clone(whole.Forward(x, batch, true))
	dy := randn(r, batch*per)
	wantDx := slices.Clone(whole.Backward(dy))
	for _, cut := range [][2]int{{0, 3}, {3, 7}, {7, 11}} {
		l := NewDropout(0.5, 99)
		l.first = cut[0]
		lo, hi := cut[0]*per, cut[1]*per
		if y := l.Forward(x[lo:hi], cut[1]-cut[0], true); !slices.Equal(y, want[lo:hi]) {
			t.Errorf("samples %v: masks differ from the whole batch's", cut)
		}
		if dx := l.Backward(dy[lo:hi]); !slices.Equal(dx, wantDx[lo:hi]) {
			t.Errorf("samples %v: Backward differs from the whole batch's", cut)
		}
	}
}

// warmAllocs is the allocations per call of step once warm: the least of
// up to three testing.AllocsPerRun(10, step) rounds. AllocsPerRun counts
// the whole process's allocations, and with several threads every step
// blocks on channels: the runtime allocates a sudog for a blocked
// goroutine when its cache is empty, which a garbage collection (set off
// by other tests running in the process) empties. A CI run under load saw
// one round of ten steps count such an allocation. An allocation that a
// step of ours really makes shows in every round.
func warmAllocs(step func()) float64 {
	least := testing.AllocsPerRun(10, step)
	for range 2 {
		if least == 0 {
			break
		}
		least = min(least, testing.AllocsPerRun(10, step))
	}
	return least
}

// TestThreadsStepDoesNotAllocate checks that a warm step on two threads
// allocates nothing, as on one.
func TestThreadsStepDoesNotAllocate(t *testing.T) {
	if testing.Short() || raceEnabled || kernels.Backend() != "openblas" {
		t.Skip("allocation accounting (OpenBLAS, not under -short or -race)")
	}
	for _, name := range Names() {
		n, _ := New(name, testOptions(name, Options{}))
		if err := n.SetThreads(2); err != nil {
			t.Fatal(err)
		}
		const batch = 16
		x, labels := threadBatch(n, batch)
		d := make([]float32, batch*10)
		step := func() {
			n.ZeroGrad()
			SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, 10, d)
			n.BackwardNotify(d, func(int) {})
		}
		step()
		if a := warmAllocs(step); a != 0 {
			t.Errorf("%s: %v allocations per step on 2 threads, want 0", name, a)
		}
		n.Close()
	}
}
