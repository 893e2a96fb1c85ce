package aggregator

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// push reads (when read) and pushes rank's whole gradient of constant v
// for its next step.
func push(t *testing.T, s *AsyncShard, rank int, read bool, v float32) Receipt {
	t.Helper()
	if read {
		s.Read(rank)
	}
	g := make([]float32, len(s.Params()))
	for i := range g {
		g[i] = v
	}
	rc, complete, err := s.Add(rank, s.Next(rank), 0, len(g), adder(g))
	if err != nil || !complete {
		t.Fatalf("rank %d: complete=%v err=%v", rank, complete, err)
	}
	return rc
}

// TestAsyncShardOneRankIsSync: with one rank there is nothing to be stale
// against, and async applies exactly what the synchronous shard does.
func TestAsyncShardOneRankIsSync(t *testing.T) {
	a := NewAsyncShard(make([]float32, 5), 1, plainSGD{lr: 0.5}, Unbounded, false)
	s := NewSyncShard(make([]float32, 5), 1, plainSGD{lr: 0.5}, false)
	for step := int64(0); step < 4; step++ {
		g := []float32{1, -2, 0.25, float32(step), 3}
		if _, err := s.Add(0, step, 0, 5, adder(g)); err != nil {
			t.Fatal(err)
		}
		a.Read(0)
		// Two pieces, to cover in-order assembly.
		if _, complete, err := a.Add(0, step, 0, 2, adder(g[:2])); err != nil || complete {
			t.Fatalf("first piece: complete=%v err=%v", complete, err)
		}
		rc, complete, err := a.Add(0, step, 2, 3, adder(g[2:]))
		if err != nil || !complete || !rc.Applied || rc.StaleSteps != 0 || rc.StaleUpdates != 0 {
			t.Fatalf("step %d: %+v complete=%v err=%v", step, rc, complete, err)
		}
	}
	if !slices.Equal(a.Params(), s.Params()) {
		t.Fatalf("async %v, sync %v", a.Params(), s.Params())
	}
	if st := a.Stats(); st.Applied != 4 || a.Version() != 4 || a.Clock() != 4 {
		t.Fatalf("stats %+v version %d clock %d", st, a.Version(), a.Clock())
	}
}

// TestAsyncShardNoBarrier: a rank's gradient is applied (scaled by
// 1/world) as soon as it is in; a fast rank never waits; the slow rank's
// gradient is as stale as the updates applied since it read.
func TestAsyncShardNoBarrier(t *testing.T) {
	s := NewAsyncShard(make([]float32, 3), 2, plainSGD{lr: 1}, Unbounded, false)
	s.Read(1) // rank 1 reads at version 0, then is slow
	for i := range 5 {
		if !s.Ready(0) {
			t.Fatalf("async: rank 0 not ready at step %d", i)
		}
		if rc := push(t, s, 0, true, 2); !rc.Applied || rc.StaleUpdates != 0 || rc.StaleSteps != 0 {
			t.Fatalf("rank 0 step %d: %+v", i, rc)
		}
		if got := s.Params()[0]; got != float32(-(i + 1)) { // each push moves by 2/2
			t.Fatalf("after %d pushes of rank 0: %v", i+1, got)
		}
	}
	if s.Clock() != 0 || !slices.Equal(s.Laggards(), []int{1}) {
		t.Fatalf("clock %d laggards %v; want 0 and [1]", s.Clock(), s.Laggards())
	}
	rc := push(t, s, 1, false, 2)
	if !rc.Applied || rc.StaleUpdates != 5 || rc.StaleSteps != 0 {
		t.Fatalf("slow rank: %+v; want 5 updates stale, 0 steps", rc)
	}
	st := s.Stats()
	if st.Applied != 6 || st.StaleUpdatesMax != 5 || st.StaleUpdatesSum != 5 || st.Refused != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAsyncShardBound: with bound s a rank may be at most s steps ahead
// of the slowest; it is ready again when the slowest pushes or finishes.
func TestAsyncShardBound(t *testing.T) {
	for _, bound := range []int{0, 1, 2, 5} {
		s := NewAsyncShard(make([]float32, 2), 3, plainSGD{lr: 1}, bound, false)
		for range bound + 1 {
			if !s.Ready(0) {
				t.Fatalf("bound %d: rank 0 not ready at step %d", bound, s.Next(0))
			}
			push(t, s, 0, true, 1)
		}
		if s.Ready(0) {
			t.Fatalf("bound %d: rank 0 ready at step %d while the slowest is at 0", bound, s.Next(0))
		}
		if got := s.Laggards(); !slices.Equal(got, []int{1, 2}) {
			t.Fatalf("bound %d: laggards %v", bound, got)
		}
		push(t, s, 1, true, 1)
		if s.Ready(0) {
			t.Fatalf("bound %d: rank 0 ready while rank 2 is still at step 0", bound)
		}
		s.Finish(2)
		if !s.Ready(0) || s.Clock() != 1 {
			t.Fatalf("bound %d: rank 0 not ready (clock %d) after rank 2 finished and rank 1 pushed", bound, s.Clock())
		}
		if st := s.Stats(); st.StaleStepsMax > int64(bound) || st.Refused != 0 {
			t.Fatalf("bound %d: %+v", bound, st)
		}
	}
}

// TestAsyncShardRefusesTooStale: a gradient computed on parameters read
// more than s steps of the Clock ago is refused and counted (it can only
// happen to a rank that pushes without reading for its step); without a
// bound the same gradient is applied and its staleness reported.
func TestAsyncShardRefusesTooStale(t *testing.T) {
	for _, bound := range []int{1, Unbounded} {
		s := NewAsyncShard(make([]float32, 2), 2, plainSGD{lr: 1}, bound, false)
		push(t, s, 0, true, 1) // rank 0 step 0, read at clock 0
		push(t, s, 0, true, 1) // step 1, read at clock 0 (1 ahead: allowed)
		push(t, s, 1, true, 1) // clock 1
		push(t, s, 1, true, 1) // clock 2
		before := slices.Clone(s.Params())
		rc := push(t, s, 0, false, 1) // step 2 on parameters read at clock 0
		if rc.StaleSteps != 2 || rc.StaleUpdates != 3 {
			t.Fatalf("bound %d: receipt %+v; want 2 steps and 3 updates stale", bound, rc)
		}
		st := s.Stats()
		if bound == 1 {
			if !rc.Refused || rc.Applied || st.Refused != 1 || !slices.Equal(before, s.Params()) {
				t.Fatalf("bound 1: %+v stats %+v; want the gradient refused and the parameters unchanged", rc, st)
			}
			if s.Next(0) != 3 {
				t.Fatalf("a refused gradient consumes the step: next %d", s.Next(0))
			}
		} else if !rc.Applied || st.Refused != 0 {
			t.Fatalf("async: %+v stats %+v", rc, st)
		}
	}
}

func TestAsyncShardRefusals(t *testing.T) {
	s := NewAsyncShard(make([]float32, 4), 2, plainSGD{lr: 1}, Unbounded, false)
	one := adder([]float32{1, 1, 1, 1})
	var stale *StaleError
	if _, _, err := s.Add(2, 0, 0, 4, one); err == nil {
		t.Error("rank out of range accepted")
	}
	if _, _, err := s.Add(0, 1, 0, 4, one); err == nil {
		t.Error("a future step accepted")
	}
	if _, _, err := s.Add(0, 0, 1, 3, one); err == nil {
		t.Error("a piece out of order accepted")
	}
	if _, _, err := s.Add(0, 0, 2, 3, one); err == nil {
		t.Error("a piece past the end accepted")
	}
	if _, _, err := s.Add(0, 0, 0, 4, one); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Add(0, 0, 0, 4, one); !errors.As(err, &stale) || stale.Got != 0 || stale.Want != 1 {
		t.Errorf("a repeated step: %v; want a StaleError", err)
	}
	s.Finish(1)
	if _, _, err := s.Add(1, 0, 0, 4, one); err == nil {
		t.Error("a finished rank's gradient accepted")
	}
}

func TestAsyncShardNonFinite(t *testing.T) {
	nan := float32(math.NaN())
	bad := adder([]float32{1, nan})
	s := NewAsyncShard([]float32{0, 0}, 1, plainSGD{lr: 1}, Unbounded, true)
	if rc, _, err := s.Add(0, 0, 0, 2, bad); err != nil || rc.Applied || s.Stats().Skipped != 1 || s.Params()[0] != 0 {
		t.Fatalf("skip: %+v %v %v", rc, err, s.Params())
	}
	s = NewAsyncShard([]float32{0, 0}, 1, plainSGD{lr: 1}, Unbounded, false)
	if _, _, err := s.Add(0, 0, 0, 2, bad); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("fail: %v", err)
	}
}
