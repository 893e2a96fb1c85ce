package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Direction is which way a tensor travels on a link.
type Direction uint8

// The directions: activations from stage s to s+1, their gradients from
// s+1 back to s.
const (
	Activation Direction = iota + 1
	Gradient
)

func (d Direction) String() string {
	switch d {
	case Activation:
		return "activation"
	case Gradient:
		return "gradient"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// Header says what one message on a link is: a micro-batch's activation
// or activation gradient in a step, with its shape. Shape is (samples,
// values per sample) of the row-major tensor: a stage's boundary is flat
// to the layers on both sides of it.
// Eval marks an evaluation pass's activations (Executor.Infer), whose
// steps count apart from training's.
type Header struct {
	Step       int64
	MicroBatch int
	Dir        Direction
	Shape      [2]int
	Eval       bool
}

func (h Header) String() string {
	kind := "step"
	if h.Eval {
		kind = "evaluation"
	}
	return fmt.Sprintf("%v of micro-batch %d of %s %d, shape %d×%d", h.Dir, h.MicroBatch, kind, h.Step, h.Shape[0], h.Shape[1])
}

// Len is the number of values the header's tensor holds.
func (h Header) Len() int { return h.Shape[0] * h.Shape[1] }

// HeaderError is a message that is not the one a receiver's plan expects.
// Stale says it belongs to an earlier step (a transport answers Aborted);
// otherwise it is malformed or out of order (InvalidArgument).
type HeaderError struct {
	Stale bool
	Msg   string
}

func (e *HeaderError) Error() string { return "pipeline: " + e.Msg }

// Check returns nil when got is the message want describes, else a
// *HeaderError saying what differs and what was expected.
func (want Header) Check(got Header) error {
	switch {
	case got.Eval != want.Eval:
		return &HeaderError{Msg: fmt.Sprintf("got the %v, want the %v", got, want)}
	case got.Dir != want.Dir:
		return &HeaderError{Msg: fmt.Sprintf("got an %v, want the %v", got.Dir, want)}
	case got.Step != want.Step:
		return &HeaderError{Stale: got.Step < want.Step, Msg: fmt.Sprintf("got the %v, want step %d", got, want.Step)}
	case got.MicroBatch != want.MicroBatch:
		return &HeaderError{Msg: fmt.Sprintf("got the %v, want micro-batch %d (a link carries micro-batches in its plan's order)", got, want.MicroBatch)}
	case got.Shape != want.Shape:
		return &HeaderError{Msg: fmt.Sprintf("got the %v, want shape %d×%d", got, want.Shape[0], want.Shape[1])}
	}
	return nil
}

// ErrPeerGone says the stage at the other end of a link aborted it or can
// no longer be reached.
var ErrPeerGone = errors.New("peer gone")

// ErrAborted says this end of a link was aborted; it is not reusable.
var ErrAborted = errors.New("link aborted")

// PeerError is a failed transfer, naming the stage at the other end.
type PeerError struct {
	Stage int
	Err   error
}

func (e *PeerError) Error() string { return fmt.Sprintf("stage %d: %v", e.Stage, e.Err) }

func (e *PeerError) Unwrap() error { return e.Err }

// Link is one stage's end of the link to a neighbouring stage: the next
// stage's end sends activations and receives gradients, the previous
// stage's end the reverse. Each direction delivers messages in the order
// they were sent. One goroutine (the stage's) uses a Link at a time.
type Link interface {
	// Send sends the tensor data, of h.Len() values; data is borrowed
	// until Send returns. It may return before the peer receives it.
	Send(ctx context.Context, h Header, data []float32) error
	// Recv receives the next message into dst (want.Len() values) if it
	// is the one want describes, else returns a *HeaderError and breaks
	// the link; a failed Recv leaves dst undefined.
	Recv(ctx context.Context, want Header, dst []float32) error
	// Abort breaks the link for good: both ends' later and pending
	// operations fail, the peer's with a *PeerError naming this stage and
	// wrapping ErrPeerGone and cause. It does not block.
	Abort(cause error)
}

// once is a one-time event with a reason: a link end's abort.
type once struct {
	once sync.Once
	done chan struct{}
	err  error
}

func newOnce() *once { return &once{done: make(chan struct{})} }

func (o *once) fire(err error) {
	o.once.Do(func() {
		o.err = err
		close(o.done)
	})
}

// memMsg is one message of a MemLink: a header and its own copy of the
// values.
type memMsg struct {
	h    Header
	data []float32
}

// MemLink is an in-process Link over channels: one end of a link made by
// Pipe. It copies values on Send, so senders may reuse their buffers.
type MemLink struct {
	self, peer int // this end's stage and the other end's
	out        chan<- memMsg
	in         <-chan memMsg
	mine       *once // fired when this end aborts
	theirs     *once // fired when the peer's end aborts
}

// Pipe returns the two ends of an in-process link between stages upper
// and upper+1: next is upper's end (it sends activations), prev is
// upper+1's end (it sends gradients). Each direction holds capacity
// messages between send and receive; 0 makes every transfer a rendezvous,
// which every valid plan runs with (see package pipeline).
func Pipe(upper, capacity int) (next, prev *MemLink) {
	if capacity < 0 {
		panic(fmt.Sprintf("stage: Pipe: negative capacity %d", capacity))
	}
	act, grad := make(chan memMsg, capacity), make(chan memMsg, capacity)
	a, b := newOnce(), newOnce()
	next = &MemLink{self: upper, peer: upper + 1, out: act, in: grad, mine: a, theirs: b}
	prev = &MemLink{self: upper + 1, peer: upper, out: grad, in: act, mine: b, theirs: a}
	return next, prev
}

// broken returns the error for an operation after an abort of either end.
func (l *MemLink) broken(which *once) error {
	if which == l.mine {
		return fmt.Errorf("stage %d's link to stage %d: %w: %w", l.self, l.peer, ErrAborted, l.mine.err)
	}
	return &PeerError{Stage: l.peer, Err: fmt.Errorf("%w: %w", ErrPeerGone, l.theirs.err)}
}

// Send implements Link.
func (l *MemLink) Send(ctx context.Context, h Header, data []float32) error {
	if len(data) != h.Len() {
		return fmt.Errorf("stage: sending %d values under a header of shape %d×%d", len(data), h.Shape[0], h.Shape[1])
	}
	select {
	case <-l.mine.done:
		return l.broken(l.mine)
	case <-l.theirs.done:
		return l.broken(l.theirs)
	default:
	}
	select {
	case l.out <- memMsg{h, slices.Clone(data)}:
		return nil
	case <-l.mine.done:
		return l.broken(l.mine)
	case <-l.theirs.done:
		return l.broken(l.theirs)
	case <-ctx.Done():
		return fmt.Errorf("sending the %v to stage %d: %w", h, l.peer, context.Cause(ctx))
	}
}

// Recv implements Link.
func (l *MemLink) Recv(ctx context.Context, want Header, dst []float32) error {
	if len(dst) != want.Len() {
		return fmt.Errorf("stage: receiving the %v into %d values", want, len(dst))
	}
	var m memMsg
	select {
	case <-l.mine.done:
		return l.broken(l.mine)
	case m = <-l.in:
	case <-l.theirs.done:
		// Messages sent before the peer aborted are still delivered.
		select {
		case m = <-l.in:
		default:
			return l.broken(l.theirs)
		}
	case <-ctx.Done():
		return fmt.Errorf("waiting for the %v from stage %d: %w", want, l.peer, context.Cause(ctx))
	}
	if err := want.Check(m.h); err != nil {
		l.Abort(err)
		return &PeerError{Stage: l.peer, Err: err}
	}
	copy(dst, m.data)
	return nil
}

// Abort implements Link.
func (l *MemLink) Abort(cause error) {
	if cause == nil {
		cause = errors.New("aborted")
	}
	l.mine.fire(cause)
}
