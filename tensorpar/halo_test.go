package tensorpar_test

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/tensorpar"
)

func TestHaloFrameRoundTrip(t *testing.T) {
	for _, f := range []tensorpar.HaloFrame{
		{Group: 3, Seq: 1, From: 0, Side: tensorpar.Above, Data: []float32{}},
		{Group: math.MaxUint32, Seq: math.MaxUint64, From: 7, Side: tensorpar.Below, Data: []float32{1, -2.5, float32(math.Inf(1)), 0}},
	} {
		b := tensorpar.EncodeHaloFrame(nil, f)
		if len(b) != 24+4*len(f.Data) {
			t.Errorf("%+v: %d bytes, want %d", f, len(b), 24+4*len(f.Data))
		}
		g, err := tensorpar.DecodeHaloFrame(b)
		if err != nil {
			t.Fatal(err)
		}
		if g.Group != f.Group || g.Seq != f.Seq || g.From != f.From || g.Side != f.Side || !slicesBitEqual(g.Data, f.Data) {
			t.Errorf("decoded %+v, want %+v", g, f)
		}
		if err := g.Check(f, len(f.Data)); err != nil {
			t.Errorf("Check of the frame itself: %v", err)
		}
	}
}

// TestHaloFrameRefused: bytes that are no frame are malformed, and a
// frame of the wrong group, sender (shard), side, exchange or length is
// unexpected.
func TestHaloFrameRefused(t *testing.T) {
	good := tensorpar.HaloFrame{Group: 3, Seq: 5, From: 1, Side: tensorpar.Above, Data: []float32{1, 2}}
	b := tensorpar.EncodeHaloFrame(nil, good)
	for name, bad := range map[string][]byte{
		"short header":   b[:23],
		"short data":     b[:len(b)-1],
		"long data":      append(bytes.Clone(b), 0, 0, 0, 0),
		"side 0":         func() []byte { c := bytes.Clone(b); c[16] = 0; return c }(),
		"side 3":         func() []byte { c := bytes.Clone(b); c[16] = 3; return c }(),
		"reserved bytes": func() []byte { c := bytes.Clone(b); c[18] = 1; return c }(),
		"huge count":     func() []byte { c := bytes.Clone(b); c[23] = 0x10; return c }(),
	} {
		if _, err := tensorpar.DecodeHaloFrame(bad); !errors.Is(err, tensorpar.ErrBadHaloFrame) {
			t.Errorf("%s: %v, want ErrBadHaloFrame", name, err)
		}
	}
	for name, want := range map[string]tensorpar.HaloFrame{
		"group": {Group: 4, Seq: 5, From: 1, Side: tensorpar.Above},
		"shard": {Group: 3, Seq: 5, From: 2, Side: tensorpar.Above},
		"side":  {Group: 3, Seq: 5, From: 1, Side: tensorpar.Below},
		"seq":   {Group: 3, Seq: 6, From: 1, Side: tensorpar.Above},
	} {
		if err := good.Check(want, 2); !errors.Is(err, aggregator.ErrUnexpectedFrame) {
			t.Errorf("wrong %s: %v, want ErrUnexpectedFrame", name, err)
		}
	}
	if err := good.Check(good, 3); !errors.Is(err, aggregator.ErrUnexpectedFrame) {
		t.Errorf("wrong length: %v, want ErrUnexpectedFrame", err)
	}
}

// FuzzDecodeHaloFrame: DecodeHaloFrame never panics, and what it accepts
// is exactly one frame, whose encoding gives back the same bytes.
func FuzzDecodeHaloFrame(f *testing.F) {
	f.Add(tensorpar.EncodeHaloFrame(nil, tensorpar.HaloFrame{Group: 1, Seq: 2, From: 3, Side: tensorpar.Below, Data: []float32{4, 5}}))
	f.Add(tensorpar.EncodeHaloFrame(nil, tensorpar.HaloFrame{Side: tensorpar.Above}))
	f.Add([]byte{})
	f.Add(make([]byte, 24))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := tensorpar.DecodeHaloFrame(b)
		if err != nil {
			if !errors.Is(err, tensorpar.ErrBadHaloFrame) {
				t.Fatalf("error %v does not wrap ErrBadHaloFrame", err)
			}
			return
		}
		if len(fr.Data) > tensorpar.MaxHaloValues {
			t.Fatalf("%d values", len(fr.Data))
		}
		if again := tensorpar.EncodeHaloFrame(nil, fr); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, decoded from %x", again, b)
		}
	})
}
