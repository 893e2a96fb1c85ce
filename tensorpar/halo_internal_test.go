package tensorpar

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
)

// TestMemHaloRefusesWrongFrames: a frame of another group, from another
// rank (shard), for the other side, of another exchange or length, or no
// frame at all, arriving where a neighbour's frame is expected, is
// refused (ErrUnexpectedFrame or ErrBadHaloFrame), never written into the
// receiver's buffer, and breaks the link for later calls.
func TestMemHaloRefusesWrongFrames(t *testing.T) {
	ok := HaloFrame{Group: 5, Seq: 1, From: 0, Side: Above, Data: []float32{1, 2, 3}}
	for _, c := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"right frame", EncodeHaloFrame(nil, ok), nil},
		{"other group", EncodeHaloFrame(nil, HaloFrame{Group: 6, Seq: 1, From: 0, Side: Above, Data: []float32{1, 2, 3}}), aggregator.ErrUnexpectedFrame},
		{"other shard", EncodeHaloFrame(nil, HaloFrame{Group: 5, Seq: 1, From: 2, Side: Above, Data: []float32{1, 2, 3}}), aggregator.ErrUnexpectedFrame},
		{"other side", EncodeHaloFrame(nil, HaloFrame{Group: 5, Seq: 1, From: 0, Side: Below, Data: []float32{1, 2, 3}}), aggregator.ErrUnexpectedFrame},
		{"other exchange", EncodeHaloFrame(nil, HaloFrame{Group: 5, Seq: 2, From: 0, Side: Above, Data: []float32{1, 2, 3}}), aggregator.ErrUnexpectedFrame},
		{"other length", EncodeHaloFrame(nil, HaloFrame{Group: 5, Seq: 1, From: 0, Side: Above, Data: []float32{1, 2}}), aggregator.ErrUnexpectedFrame},
		{"no frame", []byte{1, 2, 3}, ErrBadHaloFrame},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bounds a hang only
			defer cancel()
			hs := NewMemHalo(2, 5)
			hs[1].in[Above] <- c.frame // in place of rank 0's frame
			dst := []float32{-1, -1, -1}
			err := hs[1].Exchange(ctx, []float32{9}, nil, dst, nil)
			if c.want == nil {
				if err != nil || dst[0] != 1 || dst[2] != 3 {
					t.Fatalf("right frame: %v, dst %v", err, dst)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			if dst[0] != -1 || dst[1] != -1 || dst[2] != -1 {
				t.Errorf("the refused frame was written into the buffer: %v", dst)
			}
			hs[1].in[Above] <- EncodeHaloFrame(nil, HaloFrame{Group: 5, Seq: 2, From: 0, Side: Above, Data: []float32{1, 2, 3}})
			if err := hs[1].Exchange(ctx, []float32{9}, nil, dst, nil); err == nil || !errors.Is(err, c.want) {
				t.Errorf("after a refusal: %v, want the link broken by %v", err, c.want)
			}
		})
	}
	// a side without a neighbour takes no values.
	hs := NewMemHalo(1, 5)
	if err := hs[0].Exchange(context.Background(), []float32{1}, nil, nil, nil); err == nil {
		t.Error("rank 0 of 1 sent above")
	}
}
