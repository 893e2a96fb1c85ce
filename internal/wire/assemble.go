package wire

import (
	"fmt"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Assembler checks the frames of one tensor as they arrive on a stream:
// each frame's tags (Check), its phase, that it starts where the last
// one ended (frames arrive in order, without gaps or overlaps), and that
// the frame marked last ends the tensor. It returns the element range
// each frame covers, for the caller to fill its destination from the
// frame's data in whatever form the data is held (a pb.TensorFrame's
// bytes: Copy; gRPC's receive buffers: framecodec.Frame.Assemble; a
// parameter-server shard's sum). Every refusal is a *Mismatch (Stale
// for an older generation or step), so the caller maps it to a status
// code as it maps Check's. The zero value takes nothing: Start it first.
type Assembler struct {
	want  Expect
	phase uint32
	next  int  // elements taken so far: where the next frame must start
	done  bool // the last frame was taken
}

// Start readies a for the frames of a tensor of want.Total elements
// whose frames are tagged phase (0 where the stream has no phases).
func (a *Assembler) Start(want Expect, phase uint32) {
	*a = Assembler{want: want, phase: phase}
}

// Take checks frame f, whose data (dataLen bytes) and scales (scalesLen
// bytes) may be held elsewhere (see CheckSized), as the next frame of
// the tensor, and returns the element range [off, off+n) it covers.
// Done reports whether it was the last.
func (a *Assembler) Take(f *pb.TensorFrame, dataLen, scalesLen int) (off, n int, err error) {
	if f == nil {
		return 0, 0, &Mismatch{Msg: "missing frame"}
	}
	if a.done {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame at offset %d after the last frame of the tensor of %d elements", f.Offset, a.want.Total)}
	}
	off, n, err = CheckSized(f, dataLen, scalesLen, a.want)
	if err != nil {
		return 0, 0, err
	}
	if f.Phase != a.phase {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame for phase %d, want phase %d", f.Phase, a.phase)}
	}
	if off != a.next {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("frame at offset %d, want %d (frames in order)", off, a.next)}
	}
	if f.Last && off+n != int(a.want.Total) {
		return 0, 0, &Mismatch{Msg: fmt.Sprintf("last frame ends at %d of %d elements", off+n, a.want.Total)}
	}
	a.next, a.done = off+n, f.Last
	return off, n, nil
}

// Copy takes f (see Take) and copies its float32 values into dst, the
// whole tensor (want.Total values); the tensor's dtype must be float32.
func (a *Assembler) Copy(dst []float32, f *pb.TensorFrame) error {
	if len(dst) != int(a.want.Total) || (a.want.DType != pb.DType_D_TYPE_UNSPECIFIED && a.want.DType != pb.DType_D_TYPE_F32) {
		panic(fmt.Sprintf("wire: Assembler.Copy: %d float32 values for a tensor of %d %v elements", len(dst), a.want.Total, a.want.DType))
	}
	off, n, err := a.Take(f, len(f.GetData()), len(f.GetScales()))
	if err != nil {
		return err
	}
	if err := GetF32(dst[off:off+n], f.Data); err != nil {
		return &Mismatch{Msg: err.Error()}
	}
	return nil
}

// Done reports whether the tensor's last frame was taken.
func (a *Assembler) Done() bool { return a.done }

// Received is the number of elements taken so far.
func (a *Assembler) Received() int { return a.next }
