package server

import (
	"math"
	"testing"
	"time"
)

// TestArrivalLags: each rank's lag is measured from the first rank's
// arrival in the same step, and takeLag averages since the last call.
func TestArrivalLags(t *testing.T) {
	p := &psJob{world: 3}
	t0 := testTime()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for step := range 2 {
		base := t0.Add(ms(1000 * step))
		p.lags.arrived(0, 3, base.Add(ms(5)), false)
		p.lags.arrived(2, 3, base, false)
		p.lags.arrived(1, 3, base.Add(ms(200+10*step)), true)
	}
	for rank, want := range []float64{0.005, 0.205, 0} {
		got, ok := p.takeLag(rank)
		if !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("rank %d: lag %v (%v); want %v", rank, got, ok, want)
		}
	}
	if _, ok := p.takeLag(1); ok {
		t.Error("takeLag right after takeLag: want nothing new")
	}
}

func testTime() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
