package aggregator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
)

func TestParseAlgorithm(t *testing.T) {
	for _, name := range aggregator.AlgorithmNames {
		a, err := aggregator.ParseAlgorithm(name)
		if err != nil || a.String() != name {
			t.Errorf("%q: %v, %v", name, a, err)
		}
	}
	if a, err := aggregator.ParseAlgorithm(""); err != nil || a != aggregator.AlgoAuto {
		t.Errorf(`"": %v, %v; want auto`, a, err)
	}
	if _, err := aggregator.ParseAlgorithm("nccl"); err == nil {
		t.Error("nccl accepted")
	}
}

// TestFitCost: a least-squares fit recovers α and β from exact points.
func TestFitCost(t *testing.T) {
	alpha, perByte := 40*time.Microsecond, 0.5e-9 // 2 GB/s
	var bytes []int
	var took []time.Duration
	for _, b := range []int{0, 4 << 10, 256 << 10, 4 << 20} {
		bytes = append(bytes, b)
		took = append(took, alpha+time.Duration(float64(b)*perByte*1e9))
	}
	m, err := aggregator.FitCost(bytes, took)
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Alpha - alpha; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("alpha %v, want %v", m.Alpha, alpha)
	}
	if got := m.PerByte(); got < 0.49e-9 || got > 0.51e-9 {
		t.Errorf("beta %g s/B, want %g", got, perByte)
	}
	if _, err := aggregator.FitCost([]int{8, 8}, took[:2]); err == nil {
		t.Error("two probes of one size accepted")
	}
}

// TestChoose: with a latency-bound model the log-depth algorithms win for
// small messages on larger worlds, and the ring wins for large ones
// (it sends the fewest bytes on the critical path); every world and size
// gets an answer, the same on every call.
func TestChoose(t *testing.T) {
	m := aggregator.CostModel{Alpha: 100 * time.Microsecond, Beta: 500 * time.Nanosecond}
	if a, _ := m.Choose(8, 1024, 0); a == aggregator.AlgoRing {
		t.Errorf("4 KiB over 8 ranks: picked the ring, want a log-depth algorithm")
	}
	if a, _ := m.Choose(4, 16<<20, 0); a != aggregator.AlgoRing {
		t.Errorf("64 MiB over 4 ranks: picked %v, want ring", a)
	}
	for n := 1; n <= 9; n++ {
		for _, elems := range []int{0, 1, 1000, 1 << 20, 1 << 24} {
			a, est := m.Choose(n, elems, 0)
			b, _ := m.Choose(n, elems, 0)
			if a != b || len(est) != len(aggregator.Algorithms) {
				t.Fatalf("n=%d elems=%d: %v then %v, %d estimates", n, elems, a, b, len(est))
			}
			for _, e := range est {
				if e.Time < 0 {
					t.Errorf("n=%d elems=%d: %v estimate %v", n, elems, e.Algo, e.Time)
				}
			}
		}
	}
}

// TestCalibrate: every rank gets the same model, fitted from a clock that
// makes each probe cost exactly α + b·β one way (the clock advances as the
// probes are sent).
func TestCalibrate(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		ps := newMemPeers(1)(t, n)
		var clock fakeClock
		models := make([]aggregator.CostModel, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, p := range ps {
			var now func() time.Time
			if i == 0 {
				now = clock.now
			}
			cp := &clocked{Peers: p, c: &clock}
			wg.Go(func() {
				models[i], errs[i] = aggregator.Calibrate(t.Context(), cp, 1, aggregator.Options{}, now, aggregator.CostMem)
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("n=%d rank %d: %v", n, i, errs[i])
			}
			if models[i] != models[0] {
				t.Errorf("n=%d: rank %d got %+v, rank 0 %+v", n, i, models[i], models[0])
			}
		}
		if n == 1 {
			if models[0] != aggregator.CostMem {
				t.Errorf("one rank: %+v, want the fallback", models[0])
			}
			continue
		}
		if d := models[0].Alpha - 10*time.Microsecond; d < -50*time.Nanosecond || d > 50*time.Nanosecond {
			t.Errorf("n=%d: alpha %v, want 10µs", n, models[0].Alpha)
		}
		if d := models[0].Beta - 1000*time.Nanosecond; d < -10 || d > 10 { // 1 µs per KiB
			t.Errorf("n=%d: beta %v per KiB, want 1µs", n, models[0].Beta)
		}
	}
}

// fakeClock advances only when a frame is sent: by 10 µs + 1 µs per KiB.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(10*time.Microsecond + time.Duration(bytes)*time.Microsecond/1024)
}

type clocked struct {
	aggregator.Peers
	c *fakeClock
}

func (c *clocked) Send(ctx context.Context, to int, f aggregator.Frame) error {
	if f.Op == aggregator.OpBroadcast && f.Phase == aggregator.PhaseGather && len(f.Data) != 2 {
		c.c.advance(4 * len(f.Data))
	}
	return c.Peers.Send(ctx, to, f)
}

// TestChooseSharedCores: with 3 ranks on 2 cores the ring keeps all three
// busy in each of its 4 steps, while halving-doubling's fold and its one
// exchange keep two busy: for small buffers (α-bound) the model now
// prefers halving-doubling, for large ones (β-bound: the fold moves the
// whole buffer twice) still the ring; with a core per rank it is the
// ring at every size, as before.
func TestChooseSharedCores(t *testing.T) {
	m := aggregator.CostModel{Alpha: 10 * time.Microsecond, Beta: 100 * time.Nanosecond}
	for _, elems := range []int{1 << 10, 1 << 24} {
		if a, _ := m.Choose(3, elems, 0); a != aggregator.AlgoRing {
			t.Errorf("own cores, %d elements: %v, want ring", elems, a)
		}
	}
	m.Cores = 2
	if a, est := m.Choose(3, 1<<10, 0); a != aggregator.AlgoHalvingDoubling {
		t.Errorf("2 cores, 4 KiB: %v (%v), want halving_doubling", a, est)
	}
	if a, est := m.Choose(3, 1<<24, 0); a != aggregator.AlgoRing {
		t.Errorf("2 cores, 64 MiB: %v (%v), want ring", a, est)
	}
	if a, b := m.Estimate(aggregator.AlgoRing, 2, 1<<20, 0), (aggregator.CostModel{Alpha: m.Alpha, Beta: m.Beta}).Estimate(aggregator.AlgoRing, 2, 1<<20, 0); a != b {
		t.Errorf("2 ranks on 2 cores: %v, want the own-cores estimate %v", a, b)
	}
}
