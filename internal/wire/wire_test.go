package wire

import (
	"errors"
	"math"
	"testing"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 7, 8, 9, 4099} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i)*0.5 - 3
		}
		var got []float32
		sp := Splitter{FrameElems: 3}
		var frames int
		err := sp.Frames(&pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: 4}, src, func(f *pb.TensorFrame) error {
			off, m, err := Check(f, Expect{JobID: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: 4, Total: uint64(n)})
			if err != nil {
				return err
			}
			if off != len(got) {
				t.Fatalf("n=%d: frame at offset %d, want %d", n, off, len(got))
			}
			part := make([]float32, m)
			if err := GetF32(part, f.Data); err != nil {
				return err
			}
			got = append(got, part...)
			frames++
			if f.Last != (len(got) == n) {
				t.Fatalf("n=%d: last=%v at %d", n, f.Last, len(got))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := max(1, (n+2)/3); frames != want {
			t.Errorf("n=%d: %d frames, want %d", n, frames, want)
		}
		for i := range src {
			if got[i] != src[i] {
				t.Fatalf("n=%d: got[%d]=%v want %v", n, i, got[i], src[i])
			}
		}
	}
}

func TestCheckRefuses(t *testing.T) {
	want := Expect{JobID: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 10, Total: 8}
	good := func() *pb.TensorFrame {
		return &pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 10, Total: 8, Dtype: pb.DType_D_TYPE_F32, Offset: 4, Data: make([]byte, 16)}
	}
	if _, _, err := Check(good(), want); err != nil {
		t.Fatalf("good frame refused: %v", err)
	}
	cases := []struct {
		name  string
		mod   func(*pb.TensorFrame)
		stale bool
	}{
		{"job", func(f *pb.TensorFrame) { f.JobId = "k" }, false},
		{"old generation", func(f *pb.TensorFrame) { f.Generation = 2 }, true},
		{"new generation", func(f *pb.TensorFrame) { f.Generation = 4 }, false},
		{"op", func(f *pb.TensorFrame) { f.Op = pb.Op_OP_ALL_REDUCE }, false},
		{"old step", func(f *pb.TensorFrame) { f.Step = 9 }, true},
		{"future step", func(f *pb.TensorFrame) { f.Step = 11 }, false},
		{"dtype", func(f *pb.TensorFrame) { f.Dtype = pb.DType_D_TYPE_F16 }, false},
		{"total", func(f *pb.TensorFrame) { f.Total = 9 }, false},
		{"odd bytes", func(f *pb.TensorFrame) { f.Data = make([]byte, 15) }, false},
		{"past end", func(f *pb.TensorFrame) { f.Data = make([]byte, 20) }, false},
		{"offset past end", func(f *pb.TensorFrame) { f.Offset = 1 << 62 }, false},
		{"too big", func(f *pb.TensorFrame) { f.Data = make([]byte, MaxFrameBytes+4) }, false},
	}
	for _, c := range cases {
		f := good()
		c.mod(f)
		_, _, err := Check(f, want)
		var m *Mismatch
		if !errors.As(err, &m) {
			t.Errorf("%s: got %v, want a Mismatch", c.name, err)
			continue
		}
		if m.Stale != c.stale {
			t.Errorf("%s: stale=%v, want %v", c.name, m.Stale, c.stale)
		}
	}
	if _, _, err := Check(nil, want); err == nil {
		t.Error("nil frame accepted")
	}
}

func TestAllFinite(t *testing.T) {
	if !AllFinite([]float32{0, 1, -3e38}) {
		t.Error("finite values refused")
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		if AllFinite([]float32{1, bad, 2}) {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestAddF32(t *testing.T) {
	dst := []float32{1, 2}
	if err := AddF32(dst, PutF32(make([]byte, 8), []float32{0.5, -2})); err != nil {
		t.Fatal(err)
	}
	if dst[0] != 1.5 || dst[1] != 0 {
		t.Fatalf("got %v", dst)
	}
	if err := AddF32(dst, make([]byte, 7)); err == nil {
		t.Fatal("wrong length accepted")
	}
}

func FuzzCheck(f *testing.F) {
	f.Add("j", uint64(1), int32(5), int64(0), uint64(0), uint64(4), int32(1), []byte{0, 0, 128, 63})
	f.Add("x", uint64(0), int32(0), int64(-1), uint64(1<<63), uint64(0), int32(9), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, job string, gen uint64, op int32, step int64, off, total uint64, dtype int32, data []byte) {
		fr := &pb.TensorFrame{JobId: job, Generation: gen, Op: pb.Op(op), Step: step, Offset: off, Total: total, Dtype: pb.DType(dtype), Data: data}
		want := Expect{JobID: "j", Generation: 1, Op: pb.Op_OP_PUSH_GRADIENT, Step: 0, Total: 4}
		o, n, err := Check(fr, want)
		if err != nil {
			return
		}
		if o < 0 || n < 0 || uint64(o+n) > want.Total {
			t.Fatalf("accepted frame covers [%d,%d) of %d", o, o+n, want.Total)
		}
		dst := make([]float32, want.Total)
		if err := AddF32(dst[o:o+n], fr.Data); err != nil {
			t.Fatalf("accepted frame does not decode: %v", err)
		}
	})
}

// TestPieces: Pieces cuts as Frames does, handing out sub-slices of the
// source (no copies) and frames that CheckSized accepts for their size.
func TestPieces(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 10} {
		src := make([]float32, n)
		var frames []*pb.TensorFrame
		sp := Splitter{FrameElems: 3}
		tag := &pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: 4, Phase: 1}
		err := sp.Frames(tag, src, func(f *pb.TensorFrame) error {
			f.Data = nil
			frames = append(frames, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		err = sp.Pieces(tag, src, func(f *pb.TensorFrame, vals []float32) error {
			i := int(f.Chunk)
			if i >= len(frames) || f.String() != frames[i].String() {
				t.Fatalf("n=%d: piece %v, Frames sent %v", n, f, frames)
			}
			if len(vals) > 0 && &vals[0] != &src[next] {
				t.Fatalf("n=%d: piece %d is not a view of the source at %d", n, i, next)
			}
			off, m, err := CheckSized(f, 4*len(vals), 0, Expect{JobID: "j", Op: pb.Op_OP_PUSH_GRADIENT, Step: 4, Total: uint64(n)})
			if err != nil || off != next || m != len(vals) {
				t.Fatalf("n=%d: CheckSized: [%d,+%d) %v; want [%d,+%d)", n, off, m, err, next, len(vals))
			}
			next += len(vals)
			return nil
		})
		if err != nil || next != n {
			t.Fatalf("n=%d: pieces covered %d values (%v)", n, next, err)
		}
	}
	// CheckSized goes by the sizes it is given, not by f.Data.
	f := &pb.TensorFrame{JobId: "j", Total: 2, Dtype: pb.DType_D_TYPE_F32, Data: make([]byte, 8)}
	if _, _, err := CheckSized(f, 6, 0, Expect{JobID: "j", Total: 2}); err == nil {
		t.Error("CheckSized accepted 6 bytes of float32")
	}
	if _, _, err := CheckSized(f, 4, MaxFrameBytes+1, Expect{JobID: "j", Total: 2}); err == nil {
		t.Error("CheckSized accepted oversized scales")
	}
}
