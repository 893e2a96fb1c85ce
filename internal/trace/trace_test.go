package trace

import (
	"bytes"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func TestWriteChromeIsValid(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := New(t0, 0)
	r.Span("conv1", CatForward, TidCompute, t0.Add(time.Millisecond), t0.Add(3*time.Millisecond), nil)
	r.Instant("bucket 0 ready", CatBackward, TidCompute, t0.Add(4*time.Millisecond), map[string]any{"bucket": 0})
	r.Span("all-reduce bucket 0", CatComm, TidComm, t0.Add(4*time.Millisecond), t0.Add(9*time.Millisecond), map[string]any{"bytes": 4096})
	var b bytes.Buffer
	if err := r.WriteChrome(&b, 1, "rank 1", map[string]string{"job": "j"}); err != nil {
		t.Fatal(err)
	}
	evs, err := Validate(b.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(evs) != 6 {
		t.Fatalf("%d events, want 3 metadata + 3", len(evs))
	}
	last := evs[5]
	if last["ts"] != 4000.0 || last["dur"] != 5000.0 || last["tid"] != float64(TidComm) {
		t.Errorf("all-reduce event %v: want ts 4000 µs, dur 5000 µs, tid %d", last, TidComm)
	}
	for _, bad := range []string{`{}`, `{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":1}]}`, `{"traceEvents":[{"ph":"B","name":"a","pid":1,"tid":1,"ts":1}]}`} {
		if _, err := Validate([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestBoundAndConcurrency: two goroutines record at once; past the bound
// events are counted, not kept.
func TestBoundAndConcurrency(t *testing.T) {
	t0 := time.Unix(0, 0)
	r := New(t0, 1000)
	var wg sync.WaitGroup
	for tid := range 2 {
		wg.Go(func() {
			for i := range 700 {
				r.Span("x", CatComm, tid, t0, t0.Add(time.Duration(i)), nil)
			}
		})
	}
	wg.Wait()
	evs, dropped := r.Events()
	if len(evs) != 1000 || dropped != 400 {
		t.Fatalf("%d events, %d dropped; want 1000, 400", len(evs), dropped)
	}
	var nilRec *Recorder
	nilRec.Span("x", CatComm, 0, t0, t0, nil) // a nil Recorder records nothing
}

// TestOverlapMatchesBruteForce: Overlap equals counting microsecond by
// microsecond.
func TestOverlapMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Unix(0, 0)
	for trial := range 200 {
		var evs []Event
		inB := make([]bool, 256)
		for range rng.IntN(6) {
			s, d := rng.IntN(180), rng.IntN(40)
			evs = append(evs, Event{Cat: "b", Phase: 'X', Start: t0.Add(time.Duration(s) * time.Microsecond), Dur: time.Duration(d) * time.Microsecond})
			for u := s; u < s+d; u++ {
				inB[u] = true
			}
		}
		var want, wantTotal float64
		for range rng.IntN(6) {
			s, d := rng.IntN(180), rng.IntN(40)
			evs = append(evs, Event{Cat: "a", Phase: 'X', Start: t0.Add(time.Duration(s) * time.Microsecond), Dur: time.Duration(d) * time.Microsecond})
			wantTotal += float64(d) * 1e-6
			for u := s; u < s+d; u++ {
				if inB[u] {
					want += 1e-6
				}
			}
		}
		evs = append(evs, Event{Cat: "a", Phase: 'i', Start: t0})
		got, total := Overlap(evs, "a", "b")
		if math.Abs(got-want) > 1e-12 || math.Abs(total-wantTotal) > 1e-12 {
			t.Fatalf("trial %d: overlap %v of %v, want %v of %v", trial, got, total, want, wantTotal)
		}
	}
}
