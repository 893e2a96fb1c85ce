package psstep

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// addVals is a Calls.Add write of vals.
func addVals(vals []float32) func(dst []float32, add bool) error {
	return func(dst []float32, add bool) error {
		for i, v := range vals {
			if add {
				dst[i] += v
			} else {
				dst[i] = v
			}
		}
		return nil
	}
}

// TestCallsSumBroadcastBarrier: a sum in pieces from every rank, a
// broadcast from its root alone (negative zeros and NaN payloads kept bit
// for bit), a barrier, in number order; the result of each is handed out
// once the last rank's part is in.
func TestCallsSumBroadcastBarrier(t *testing.T) {
	const world = 3
	s := NewCalls(world, 8)
	sum := Call{Seq: 0, Kind: CallSum, Len: 4}
	for r := range world {
		if done, err := s.Begin(r, sum); done || err != nil {
			t.Fatalf("rank %d begin: %v %v", r, done, err)
		}
	}
	for r := range world {
		v := float32(r + 1)
		if done, err := s.Add(r, 0, 2, addVals([]float32{v, -v})); done || err != nil {
			t.Fatalf("rank %d first half: %v %v", r, done, err)
		}
		// -0.0 from every rank must stay -0.0.
		done, err := s.Add(r, 2, 2, addVals([]float32{float32(math.Copysign(0, -1)), 0.5}))
		if err != nil || done != (r == world-1) {
			t.Fatalf("rank %d second half: %v %v", r, done, err)
		}
	}
	got := s.Result()
	if got[0] != 6 || got[1] != -6 || !math.Signbit(float64(got[2])) || got[3] != 1.5 || s.Seq() != 1 {
		t.Fatalf("sum %v (seq %d), want [6 -6 -0 1.5] at seq 1", got, s.Seq())
	}
	// Broadcast from rank 1: the others send only the call.
	payload := []float32{float32(math.Copysign(0, -1)), math.Float32frombits(0x7fc00123), 3}
	bc := Call{Seq: 1, Kind: CallBroadcast, Len: 3, Root: 1}
	for _, r := range []int{0, 2, 1} {
		done, err := s.Begin(r, bc)
		if err != nil || done {
			t.Fatalf("rank %d begin broadcast: %v %v", r, done, err)
		}
	}
	if _, err := s.Add(0, 0, 3, addVals(payload)); err == nil {
		t.Fatal("a broadcast took values from a rank that is not its root")
	}
	if done, err := s.Add(1, 0, 3, addVals(payload)); !done || err != nil {
		t.Fatalf("root's values: %v %v", done, err)
	}
	for i, v := range s.Result() {
		if math.Float32bits(v) != math.Float32bits(payload[i]) {
			t.Fatalf("broadcast [%d] = %08x, want %08x", i, math.Float32bits(v), math.Float32bits(payload[i]))
		}
	}
	for r := range world {
		done, err := s.Begin(r, Call{Seq: 2, Kind: CallBarrier})
		if err != nil || done != (r == world-1) {
			t.Fatalf("rank %d barrier: %v %v", r, done, err)
		}
	}
	if len(s.Result()) != 0 || s.Seq() != 3 {
		t.Fatalf("barrier result %v at seq %d", s.Result(), s.Seq())
	}
}

// TestCallsMissingAndOrder: Missing names the ranks not in yet; calls out
// of turn, twice or too large are refused.
func TestCallsMissingAndOrder(t *testing.T) {
	s := NewCalls(3, 4)
	if _, err := s.Begin(1, Call{Seq: 0, Kind: CallSum, Len: 2}); err != nil {
		t.Fatal(err)
	}
	if m := s.Missing(); len(m) != 3 {
		t.Fatalf("missing %v: rank 1 has sent no values yet", m)
	}
	if _, err := s.Add(1, 0, 2, addVals([]float32{1, 2})); err != nil {
		t.Fatal(err)
	}
	if m := s.Missing(); len(m) != 2 || m[0] != 0 || m[1] != 2 {
		t.Fatalf("missing %v, want [0 2]", m)
	}
	for name, c := range map[string]struct {
		rank int
		call Call
		want string
	}{
		"twice":     {1, Call{Seq: 0, Kind: CallSum, Len: 2}, "twice"},
		"ahead":     {0, Call{Seq: 1, Kind: CallSum, Len: 2}, "collects call 0"},
		"too large": {0, Call{Seq: 0, Kind: CallSum, Len: 5}, "at most 4 values"},
		"rank":      {3, Call{Seq: 0, Kind: CallSum, Len: 2}, "out of range"},
	} {
		if _, err := s.Begin(c.rank, c.call); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestCallsDisagreement: a rank whose call differs from the first rank's
// is named with both calls; a layout that differs says so.
func TestCallsDisagreement(t *testing.T) {
	s := NewCalls(2, 4)
	if _, err := s.Begin(0, Call{Seq: 0, Kind: CallSum, Len: 2}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Begin(1, Call{Seq: 0, Kind: CallBroadcast, Len: 2})
	var de *DisagreeError
	if !errors.As(err, &de) || de.Rank != 1 || de.First != 0 || !strings.Contains(err.Error(), "disagree about call 0") {
		t.Fatalf("%v, want a DisagreeError naming ranks 1 and 0", err)
	}
	s = NewCalls(2, 4)
	if _, err := s.Begin(1, Call{Seq: 0, Kind: CallLayout, Lay: Layout{Elements: 10, Checksum: 7}}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Begin(0, Call{Seq: 0, Kind: CallLayout, Lay: Layout{Elements: 12, Checksum: 7}})
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "rank 0 registered another gradient layout than rank 1") {
		t.Fatalf("%v, want the layout named", err)
	}
}

// TestCallsLayoutRaisesTheLimit: once every rank registered a layout,
// calls up to its size are taken (gradient buckets of shared memory).
func TestCallsLayoutRaisesTheLimit(t *testing.T) {
	s := NewCalls(1, 4)
	if _, err := s.Begin(0, Call{Seq: 0, Kind: CallSum, Len: 10}); err == nil {
		t.Fatal("a call larger than the bound was taken before any layout")
	}
	if done, err := s.Begin(0, Call{Seq: 0, Kind: CallLayout, Lay: Layout{Elements: 10, Checksum: 1}}); !done || err != nil {
		t.Fatalf("layout: %v %v", done, err)
	}
	if s.Layout().Elements != 10 {
		t.Fatalf("layout %v", s.Layout())
	}
	if _, err := s.Begin(0, Call{Seq: 1, Kind: CallSum, Len: 10}); err != nil {
		t.Fatalf("a bucket of the layout's size: %v", err)
	}
}

// TestCallPiece: every shard gets every call, with its partition of the
// values (empty ones where there are fewer values than shards).
func TestCallPiece(t *testing.T) {
	c := Call{Seq: 4, Kind: CallSum, Len: 5}
	total := 0
	for i := range 3 {
		p, r := c.Piece(i, 3)
		if p.Seq != 4 || p.Kind != CallSum || p.Len != r.Len() || r.Lo != total {
			t.Fatalf("piece %d: %v %v", i, p, r)
		}
		total += r.Len()
	}
	if total != 5 {
		t.Fatalf("pieces cover %d of 5 values", total)
	}
	p, r := Call{Seq: 1, Kind: CallSum, Len: 1}.Piece(1, 2)
	if p.Len != 0 || r.Len() != 0 || p.Sends(0) || p.Answered() {
		t.Fatalf("an empty piece: %v %v", p, r)
	}
}
