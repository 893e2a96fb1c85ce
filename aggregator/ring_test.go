package aggregator

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestSegment(t *testing.T) {
	for n := 1; n <= 9; n++ {
		for l := 0; l <= 40; l++ {
			next := 0
			for c := range n {
				off, size := segment(l, n, c)
				if off != next {
					t.Fatalf("segment(%d, %d, %d): off %d, want %d", l, n, c, off, next)
				}
				if size != l/n && size != l/n+1 {
					t.Fatalf("segment(%d, %d, %d): size %d, want %d or %d", l, n, c, size, l/n, l/n+1)
				}
				next += size
			}
			if next != l {
				t.Fatalf("segments of %d over %d cover %d elements", l, n, next)
			}
		}
	}
}

func TestSubchunks(t *testing.T) {
	type span struct{ off, n int }
	for _, c := range []struct {
		off, size, limit int
		want             []span
	}{
		{5, 0, 3, nil},
		{5, 3, 3, []span{{5, 3}}},
		{5, 7, 3, []span{{5, 3}, {8, 3}, {11, 1}}},
		{0, 2, 4, []span{{0, 2}}},
	} {
		var got []span
		for o, m := range subchunks(c.off, c.size, c.limit) {
			got = append(got, span{o, m})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("subchunks(%d, %d, %d) = %v, want %v", c.off, c.size, c.limit, got, c.want)
		}
		if nf := nframes(c.size, c.limit); nf != len(c.want) {
			t.Errorf("nframes(%d, %d) = %d, want %d", c.size, c.limit, nf, len(c.want))
		}
	}
}

// scripted is a Ring whose left neighbour replays fixed frames and whose
// right neighbour accepts anything.
type scripted struct {
	rank, n int
	frames  []Frame
}

func (s *scripted) Rank() int                                    { return s.rank }
func (s *scripted) Size() int                                    { return s.n }
func (s *scripted) SendRight(ctx context.Context, f Frame) error { return nil }
func (s *scripted) RecvLeft(ctx context.Context) (Frame, error) {
	if len(s.frames) == 0 {
		<-ctx.Done()
		return Frame{}, ctx.Err()
	}
	f := s.frames[0]
	s.frames = s.frames[1:]
	return f, nil
}

// TestWrongFrameNotSummed feeds rank 0 of a 2-ring frames that differ from
// the expected one in a single tag: each must be rejected with the buffer
// left untouched.
func TestWrongFrameNotSummed(t *testing.T) {
	// Rank 0 of 2 with 4 elements first receives chunk 1 = [2, 4).
	good := Frame{Generation: 5, Op: OpAllReduce, Step: 3, Phase: PhaseReduceScatter, Chunk: 1, Offset: 2, Data: []float32{100, 100}}
	mutate := map[string]func(*Frame){
		"generation": func(f *Frame) { f.Generation++ },
		"op":         func(f *Frame) { f.Op = OpAllGather },
		"step":       func(f *Frame) { f.Step-- },
		"phase":      func(f *Frame) { f.Phase = PhaseGather },
		"chunk":      func(f *Frame) { f.Chunk = 0 },
		"offset":     func(f *Frame) { f.Offset = 1 },
		"length":     func(f *Frame) { f.Data = f.Data[:1] },
	}
	for name, m := range mutate {
		f := good
		m(&f)
		buf := []float32{1, 2, 3, 4}
		err := AllReduce(t.Context(), &scripted{0, 2, []Frame{f}}, buf, 3, Options{Generation: 5})
		if !errors.Is(err, ErrUnexpectedFrame) {
			t.Errorf("%s: got %v, want ErrUnexpectedFrame", name, err)
		}
		if !slices.Equal(buf, []float32{1, 2, 3, 4}) {
			t.Errorf("%s: buf = %v after a rejected frame", name, buf)
		}
	}
	// The unmodified frames are accepted.
	final := Frame{Generation: 5, Op: OpAllReduce, Step: 3, Phase: PhaseGather, Chunk: 0, Offset: 0, Data: []float32{10, 20}}
	buf := []float32{1, 2, 3, 4}
	if err := AllReduce(t.Context(), &scripted{0, 2, []Frame{good, final}}, buf, 3, Options{Generation: 5}); err != nil {
		t.Fatal(err)
	}
	if want := []float32{10, 20, 103, 104}; !slices.Equal(buf, want) {
		t.Errorf("buf = %v, want %v", buf, want)
	}
}

// failingSend is a Ring whose SendRight always fails.
type failingSend struct{ scripted }

var errLink = errors.New("link down")

func (f *failingSend) SendRight(ctx context.Context, _ Frame) error { return errLink }

// TestSendErrorReported checks that a failed send ends the call with the
// send error, not with the cancellation it causes on the receive side.
func TestSendErrorReported(t *testing.T) {
	err := AllReduce(t.Context(), &failingSend{scripted{0, 3, nil}}, make([]float32, 9), 1, Options{})
	if !errors.Is(err, errLink) {
		t.Errorf("got %v, want %v", err, errLink)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, fe := range []int{-1, MaxFrameElemsLimit + 1} {
		o := Options{MaxFrameElems: fe}
		if o.Validate() == nil {
			t.Errorf("Options{MaxFrameElems: %d}.Validate() = nil", fe)
		}
		if err := AllReduce(t.Context(), &scripted{0, 2, nil}, make([]float32, 4), 1, o); err == nil {
			t.Errorf("AllReduce with MaxFrameElems %d succeeded", fe)
		}
	}
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v", err)
	}
	if err := Broadcast(t.Context(), &scripted{0, 2, nil}, make([]float32, 4), 2, 1, Options{}); err == nil {
		t.Error("Broadcast with root 2 of 2 succeeded")
	}
}

func TestAllGatherShapePanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Error("AllGather with len(dst) != Size()*len(src) did not panic")
		}
	}()
	AllGather(t.Context(), &scripted{0, 2, nil}, make([]float32, 5), make([]float32, 2), 1, Options{})
}
