package aggregator

import (
	"errors"
	"math"
	"testing"
)

// plainSGD is params -= lr*grad, enough to see what the shard applied.
type plainSGD struct{ lr float32 }

func (o plainSGD) Step(p, g []float32) {
	for i := range p {
		p[i] -= o.lr * g[i]
	}
}

func adder(vals []float32) func([]float32) error {
	return func(dst []float32) error {
		for i := range dst {
			dst[i] += vals[i]
		}
		return nil
	}
}

func TestSyncShardAverages(t *testing.T) {
	for _, world := range []int{1, 2, 3, 5} {
		for _, n := range []int{1, 2, 7} {
			params := make([]float32, n)
			s := NewSyncShard(params, world, plainSGD{lr: 1}, false)
			for step := int64(0); step < 3; step++ {
				// Ranks interleave; each sends two pieces (the first may be empty).
				cut := n / 2
				for r := world - 1; r >= 0; r-- {
					g := make([]float32, n)
					for i := range g {
						g[i] = float32(r + 1)
					}
					if ok, err := s.Add(r, step, 0, cut, adder(g[:cut])); err != nil || ok {
						t.Fatalf("world %d n %d: first piece: applied=%v err=%v", world, n, ok, err)
					}
				}
				for r := 0; r < world; r++ {
					g := make([]float32, n)
					for i := range g {
						g[i] = float32(r + 1)
					}
					ok, err := s.Add(r, step, cut, n-cut, adder(g[cut:]))
					if err != nil {
						t.Fatal(err)
					}
					if ok != (r == world-1) {
						t.Fatalf("rank %d: applied=%v", r, ok)
					}
				}
			}
			// mean of 1..world is (world+1)/2, applied 3 times with lr 1.
			want := -3 * float32(world+1) / 2
			for i, v := range s.Params() {
				if v != want {
					t.Fatalf("world %d n %d: param %d = %v, want %v", world, n, i, v, want)
				}
			}
			if s.Step() != 3 {
				t.Fatalf("step %d", s.Step())
			}
		}
	}
}

func TestSyncShardRefuses(t *testing.T) {
	s := NewSyncShard(make([]float32, 4), 2, plainSGD{1}, false)
	ones := []float32{1, 1, 1, 1}
	if _, err := s.Add(2, 0, 0, 4, adder(ones)); err == nil {
		t.Error("rank out of range accepted")
	}
	if _, err := s.Add(0, 1, 0, 4, adder(ones)); err == nil {
		t.Error("future step accepted")
	}
	if _, err := s.Add(0, 0, 1, 3, adder(ones)); err == nil {
		t.Error("out-of-order piece accepted")
	}
	if _, err := s.Add(0, 0, 0, 5, adder(ones)); err == nil {
		t.Error("piece past the end accepted")
	}
	if _, err := s.Add(0, 0, 0, 4, adder(ones)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(0, 0, 0, 4, adder(ones)); err == nil {
		t.Error("duplicate gradient accepted")
	}
	if _, err := s.Add(1, 0, 0, 4, adder(ones)); err != nil {
		t.Fatal(err)
	}
	var stale *StaleError
	if _, err := s.Add(1, 0, 0, 4, adder(ones)); !errors.As(err, &stale) {
		t.Errorf("stale step: got %v, want StaleError", err)
	}
}

func TestSyncShardNonFinite(t *testing.T) {
	bad := []float32{1, float32(math.NaN())}
	fail := NewSyncShard([]float32{0, 0}, 1, plainSGD{1}, false)
	if _, err := fail.Add(0, 0, 0, 2, adder(bad)); !errors.Is(err, ErrNonFinite) {
		t.Errorf("fail policy: got %v", err)
	}
	skip := NewSyncShard([]float32{0, 0}, 1, plainSGD{1}, true)
	if _, err := skip.Add(0, 0, 0, 2, adder(bad)); err != nil {
		t.Fatal(err)
	}
	if skip.Skipped() != 1 || skip.Params()[0] != 0 || skip.Step() != 1 {
		t.Errorf("skip policy: skipped %d params %v step %d", skip.Skipped(), skip.Params(), skip.Step())
	}
	// The next step is clean again.
	if _, err := skip.Add(0, 1, 0, 2, adder([]float32{1, 1})); err != nil || skip.Params()[1] != -1 {
		t.Errorf("after skip: err %v params %v", err, skip.Params())
	}
}

// TestSyncShardStartAt: a resumed shard collects the checkpoint's step
// next and refuses the steps before it as stale.
func TestSyncShardStartAt(t *testing.T) {
	s := NewSyncShard([]float32{1}, 1, plainSGD{lr: 1}, false)
	s.StartAt(7)
	if s.Step() != 7 {
		t.Fatalf("Step() = %d after StartAt(7)", s.Step())
	}
	var stale *StaleError
	if _, err := s.Add(0, 6, 0, 1, adder([]float32{1})); !errors.As(err, &stale) {
		t.Fatalf("gradient for step 6: err %v, want a StaleError", err)
	}
	if ok, err := s.Add(0, 7, 0, 1, adder([]float32{0.5})); !ok || err != nil || s.Step() != 8 || s.Params()[0] != 0.5 {
		t.Fatalf("step 7: applied %v, err %v, step %d, params %v", ok, err, s.Step(), s.Params())
	}
	defer func() {
		if recover() == nil {
			t.Error("StartAt after the shard moved did not panic")
		}
	}()
	s.StartAt(3)
}
