package wire

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// asmWant is the tensor the assembler tests expect: 10 float32 values of
// phase 2 of step 7.
var asmWant = Expect{JobID: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 7, Total: 10}

// asmFrame is a float32 frame of asmWant's tensor carrying vals at off.
func asmFrame(off int, vals []float32, last bool) *pb.TensorFrame {
	return &pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 7, Phase: 2, Offset: uint64(off),
		Total: 10, Dtype: pb.DType_D_TYPE_F32, Last: last, Data: PutF32(make([]byte, 4*len(vals)), vals)}
}

func TestAssemblerFills(t *testing.T) {
	src := []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, fe := range []int{1, 3, 4, 9, 10, 11} {
		var a Assembler
		a.Start(asmWant, 2)
		dst := make([]float32, 10)
		sp := Splitter{FrameElems: fe}
		err := sp.Frames(&pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 7, Phase: 2}, src, func(f *pb.TensorFrame) error {
			if a.Done() {
				t.Fatalf("frames of %d: done before the last frame", fe)
			}
			return a.Copy(dst, f)
		})
		if err != nil {
			t.Fatalf("frames of %d: %v", fe, err)
		}
		if !a.Done() || a.Received() != 10 {
			t.Fatalf("frames of %d: done %v after %d elements", fe, a.Done(), a.Received())
		}
		for i, v := range dst {
			if v != src[i] {
				t.Fatalf("frames of %d: dst[%d] = %v, want %v", fe, i, v, src[i])
			}
		}
	}
}

func TestAssemblerEmptyTensor(t *testing.T) {
	var a Assembler
	a.Start(Expect{JobID: "j", Op: pb.Op_OP_PULL_PARAMETERS}, 0)
	off, n, err := a.Take(&pb.TensorFrame{JobId: "j", Op: pb.Op_OP_PULL_PARAMETERS, Dtype: pb.DType_D_TYPE_F32, Last: true}, 0, 0)
	if err != nil || off != 0 || n != 0 || !a.Done() {
		t.Fatalf("empty tensor: [%d,+%d) %v done %v", off, n, err, a.Done())
	}
}

// TestAssemblerRefuses feeds a good first frame, then a bad one, and
// checks the refusal: a *Mismatch saying what was wrong, Stale only for
// an older generation or step.
func TestAssemblerRefuses(t *testing.T) {
	four := []float32{1, 2, 3, 4}
	cases := []struct {
		name  string
		frame func() *pb.TensorFrame
		msg   string
		stale bool
	}{
		{"out of order", func() *pb.TensorFrame { return asmFrame(8, four[:2], true) }, "at offset 8, want 4", false},
		{"overlapping", func() *pb.TensorFrame { return asmFrame(2, four, false) }, "at offset 2, want 4", false},
		{"repeated", func() *pb.TensorFrame { return asmFrame(0, four, false) }, "at offset 0, want 4", false},
		{"short", func() *pb.TensorFrame { return asmFrame(4, four[:2], true) }, "last frame ends at 6 of 10", false},
		{"over-long", func() *pb.TensorFrame { return asmFrame(4, append(four, four...), true) }, "outside the tensor of 10", false},
		{"wrong phase", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Phase = 1; return f }, "phase 1, want phase 2", false},
		{"wrong dtype", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Dtype = pb.DType_D_TYPE_F16; return f }, "dtype", false},
		{"wrong job", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.JobId = "k"; return f }, `job "k"`, false},
		{"wrong op", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Op = pb.Op_OP_PUSH_STATE; return f }, "op", false},
		{"wrong total", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Total = 11; return f }, "11 elements", false},
		{"odd bytes", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Data = f.Data[:5]; return f }, "not a multiple of 4", false},
		{"old step", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Step = 6; return f }, "step 6, want 7", true},
		{"old generation", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Generation = 2; return f }, "generation 2", true},
		{"newer step", func() *pb.TensorFrame { f := asmFrame(4, four, false); f.Step = 8; return f }, "step 8, want 7", false},
		{"nil", func() *pb.TensorFrame { return nil }, "missing frame", false},
	}
	for _, c := range cases {
		var a Assembler
		a.Start(asmWant, 2)
		dst := make([]float32, 10)
		if err := a.Copy(dst, asmFrame(0, four, false)); err != nil {
			t.Fatalf("%s: first frame: %v", c.name, err)
		}
		f := c.frame()
		var err error
		if f == nil {
			_, _, err = a.Take(nil, 0, 0)
		} else {
			err = a.Copy(dst, f)
		}
		var mm *Mismatch
		if !errors.As(err, &mm) || !strings.Contains(err.Error(), c.msg) || mm.Stale != c.stale {
			t.Errorf("%s: got %v, want a Mismatch (stale %v) saying %q", c.name, err, c.stale, c.msg)
		}
		if a.Received() != 4 || a.Done() {
			t.Errorf("%s: a refused frame moved the assembler to %d (done %v)", c.name, a.Received(), a.Done())
		}
	}
}

func TestAssemblerAfterLast(t *testing.T) {
	var a Assembler
	a.Start(asmWant, 2)
	dst := make([]float32, 10)
	if err := a.Copy(dst, asmFrame(0, make([]float32, 10), true)); err != nil {
		t.Fatal(err)
	}
	err := a.Copy(dst, asmFrame(10, nil, true))
	if err == nil || !strings.Contains(err.Error(), "after the last frame") {
		t.Fatalf("a frame after the last: got %v", err)
	}
}

// FuzzAssembler feeds the assembler frames built from fuzz bytes (each
// 16-byte record: offset, length, flags, phase, dtype, step delta) and
// checks that it never panics, refuses with a *Mismatch only, and only
// ever accepts frames that continue the tensor in order up to its end.
func FuzzAssembler(f *testing.F) {
	f.Add([]byte{0, 4, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 6, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{3, 4, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 12, 1, 2, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Assembler
		a.Start(asmWant, 2)
		dst := make([]float32, 10)
		for ; len(b) >= 16; b = b[16:] {
			off, n := int(b[0]), int(b[1])
			fr := &pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 7 + int64(int8(b[5])),
				Phase: uint32(b[3]), Offset: uint64(off), Total: 10, Dtype: pb.DType(b[4]), Last: b[2]&1 != 0,
				Data: make([]byte, n), Span: uint64(binary.LittleEndian.Uint16(b[6:]))}
			before := a.Received()
			wasDone := a.Done()
			err := a.Copy(dst, fr)
			if err != nil {
				var mm *Mismatch
				if !errors.As(err, &mm) {
					t.Fatalf("refusal %v is not a *Mismatch", err)
				}
				continue
			}
			if wasDone || off != before || a.Received() != off+n/4 || (a.Done() && a.Received() != 10) || a.Received() > 10 {
				t.Fatalf("accepted [%d,+%d bytes) at %d (done before %v, after %v at %d)", off, n, before, wasDone, a.Done(), a.Received())
			}
		}
	})
}
