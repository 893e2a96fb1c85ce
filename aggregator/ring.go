package aggregator

import (
	"context"
	"errors"
	"fmt"
)

// Ring is this rank's view of a logical ring: it sends to its right
// neighbour (rank+1 mod Size) and receives from its left (rank−1 mod Size).
//
// Contract, relied on by the collectives in this package:
//   - Frames sent with SendRight arrive at the right neighbour's RecvLeft in
//     the order they were sent, each exactly once.
//   - SendRight must not retain f.Data after it returns successfully (it
//     copies or finishes writing the bytes first); the caller may modify it
//     afterwards. After a SendRight that failed, a zero-copy implementation
//     may go on reading f.Data until the Ring is closed (it cannot always
//     take a half-written frame back), so a failed ring is closed before
//     the buffer of the failed call is written again.
//   - The Data of a Frame returned by RecvLeft is owned by the Ring and is
//     valid only until the next RecvLeft call, so implementations may reuse
//     receive buffers.
//   - SendRight may block while the link is full; the collectives never wait
//     on SendRight and RecvLeft in the same goroutine, so any amount of
//     buffering (even none) is deadlock-free.
//   - One goroutine may call SendRight while another calls RecvLeft; neither
//     method is called concurrently with itself.
//   - Both methods return promptly once ctx is done. A broken neighbour is
//     reported as a *PeerError wrapping ErrPeerGone.
type Ring interface {
	Rank() int
	Size() int
	SendRight(ctx context.Context, f Frame) error
	RecvLeft(ctx context.Context) (Frame, error)
}

// A ReducingRing is a Ring that can combine a received frame's data into
// the collective's buffer itself. The gRPC ring sums straight from its
// receive buffers this way instead of first copying the data into a
// []float32 that the collective then adds. The collectives use it when a
// Ring implements it, and RecvLeft otherwise.
type ReducingRing interface {
	Ring
	// RecvLeftInto receives the next frame as RecvLeft does and calls
	// accept with its tags (f.Data is nil) and the number n of float32
	// values it carries. If accept returns an error, RecvLeftInto returns
	// it and leaves dst alone. Otherwise n == len(dst) (accept checks it)
	// and the values are combined into dst in index order: dst[i] += v[i]
	// if add, dst[i] = v[i] otherwise, with float32 arithmetic exactly as
	// the plain loop does it, so results are bit-identical to RecvLeft's.
	// Errors other than accept's follow RecvLeft's contract.
	RecvLeftInto(ctx context.Context, dst []float32, add bool, accept func(f Frame, n int) error) error
}

// OpKind names the collective a frame belongs to.
type OpKind uint8

// Collectives. The zero value is invalid so that an unset field is caught.
const (
	OpInvalid OpKind = iota
	OpAllReduce
	OpAllGather
	OpBroadcast
	OpBarrier
)

func (o OpKind) String() string {
	switch o {
	case OpAllReduce:
		return "allreduce"
	case OpAllGather:
		return "allgather"
	case OpBroadcast:
		return "broadcast"
	case OpBarrier:
		return "barrier"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Phases of a collective, carried in Frame.Phase.
const (
	// PhaseReduceScatter frames carry partial sums (AllReduce only).
	PhaseReduceScatter uint32 = 0
	// PhaseGather frames carry final values: the all-gather half of
	// AllReduce, and all of AllGather, Broadcast and Barrier.
	PhaseGather uint32 = 1
)

// Frame is one message on a ring link. Every field except Data is a tag the
// receiver checks against the frame it expects next; a mismatch is an
// ErrUnexpectedFrame and the data is never used.
type Frame struct {
	// Generation is the ring membership generation (Options.Generation); a
	// frame from an older ring is rejected.
	Generation uint64
	// Op is the collective this frame belongs to.
	Op OpKind
	// Step identifies the call: consecutive collectives on one ring must use
	// distinct (Op, Step) pairs so that a stray frame from an earlier,
	// aborted call is detected.
	Step int64
	// Phase is PhaseReduceScatter or PhaseGather.
	Phase uint32
	// Chunk is the ring chunk (segment) index in [0, Size) for AllReduce and
	// AllGather, the root for Broadcast, and the hop for Barrier.
	Chunk uint32
	// Offset is the element offset of Data within the collective's buffer;
	// together with len(Data) it names the sub-chunk.
	Offset int
	// Data is the payload: at most Options.MaxFrameElems float32 values.
	Data []float32
}

// Sentinel errors. Test with errors.Is.
var (
	// ErrUnexpectedFrame: a frame's tags (generation, op, step, phase,
	// chunk, offset or length) differ from the ones expected next. The ranks
	// disagree about the call (different step, length or root) or a frame
	// from another call was left on the link.
	ErrUnexpectedFrame = errors.New("unexpected frame")
	// ErrPeerGone: a neighbour closed its end of the ring or died.
	ErrPeerGone = errors.New("peer gone")
	// ErrClosed: this rank's own end of the ring was closed.
	ErrClosed = errors.New("ring closed")
)

// PeerError reports which neighbour broke the ring.
type PeerError struct {
	Rank int   // the rank of the peer that is gone
	Err  error // usually ErrPeerGone
}

func (e *PeerError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }

func (e *PeerError) Unwrap() error { return e.Err }

// Frame size limits.
const (
	// DefaultMaxFrameElems is 1 MiB of float32.
	DefaultMaxFrameElems = 1 << 18
	// MaxFrameElemsLimit keeps wire frames at or below 4 MiB of float32.
	MaxFrameElemsLimit = 1 << 20
)

// Options tune a collective. The zero value is ready to use.
type Options struct {
	// MaxFrameElems bounds the float32 elements carried by one frame; each
	// ring chunk is pipelined as sub-chunks of at most this size. 0 means
	// DefaultMaxFrameElems; it may not exceed MaxFrameElemsLimit.
	MaxFrameElems int
	// Generation tags every frame; all ranks must agree.
	Generation uint64
}

// Validate reports whether o is usable.
func (o Options) Validate() error {
	if o.MaxFrameElems < 0 || o.MaxFrameElems > MaxFrameElemsLimit {
		return fmt.Errorf("aggregator: MaxFrameElems %d out of range: want 0 (default %d) to %d",
			o.MaxFrameElems, DefaultMaxFrameElems, MaxFrameElemsLimit)
	}
	return nil
}

func (o Options) maxFrame() int {
	if o.MaxFrameElems == 0 {
		return DefaultMaxFrameElems
	}
	return o.MaxFrameElems
}
