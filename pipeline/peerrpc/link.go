package peerrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/pipeline/stage"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// FrameElems is the most float32 values one frame carries: 1 MiB.
const FrameElems = 1 << 18

// InboxFrames is how many received frames a link holds before its
// receiver stops reading (and HTTP/2 flow control holds the sender back).
const InboxFrames = 8

// abortGrace bounds how long a client link waits for its abort frame to
// be written before it cancels the stream anyway.
const abortGrace = time.Second

// msgStream is the part of a gRPC stream a link uses.
type msgStream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// Link is one end of the gRPC link between stages s and s+1: a
// stage.Link. Stage s's end (Dial) is the stream's client, stage s+1's
// (Endpoint.Accept) its server. Each end has one sender goroutine, the
// only writer of the stream, and one receiver goroutine, which checks
// each frame's link tags (job, generation, sending stage, direction) and
// queues it in a bounded inbox; Recv checks the rest (step, micro-batch,
// shape, offsets) against what the plan expects. Close stops both
// goroutines and waits for them.
type Link struct {
	job        string
	gen        uint64
	self, peer int
	sendDir    pb.PipelineDirection
	recvDir    pb.PipelineDirection
	client     bool
	stream     msgStream
	wrap       func(*pb.PipelineFrame) any       // the message that carries a frame out
	recv       func() (*pb.PipelineFrame, error) // the next frame in
	closeSend  func() error                      // the client's half-close; nil on the server
	ctx        context.Context                   // the link's lifetime
	cancel     context.CancelFunc

	out     chan any // frames for the sender
	abortCh chan any // the abort frame, at most one
	inbox   chan *pb.PipelineFrame

	deadOnce sync.Once
	dead     chan struct{} // closed when the link broke
	deadErr  error         // why; set before dead is closed
	grace    *time.Timer   // the client's abortGrace; set before dead is closed
	wg       sync.WaitGroup
}

func newLink(ctx context.Context, job string, gen uint64, self, peer int, client bool, stream msgStream) *Link {
	l := &Link{job: job, gen: gen, self: self, peer: peer, client: client, stream: stream,
		out: make(chan any, 2), abortCh: make(chan any, 1), inbox: make(chan *pb.PipelineFrame, InboxFrames),
		dead: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(ctx)
	if client {
		l.sendDir, l.recvDir = pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION, pb.PipelineDirection_PIPELINE_DIRECTION_GRADIENT
		l.wrap = func(f *pb.PipelineFrame) any { return &pb.ExchangeRequest{Frame: f} }
		l.recv = func() (*pb.PipelineFrame, error) {
			m := new(pb.ExchangeResponse)
			err := stream.RecvMsg(m)
			return m.GetFrame(), err
		}
	} else {
		l.sendDir, l.recvDir = pb.PipelineDirection_PIPELINE_DIRECTION_GRADIENT, pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION
		l.wrap = func(f *pb.PipelineFrame) any { return &pb.ExchangeResponse{Frame: f} }
		l.recv = func() (*pb.PipelineFrame, error) {
			m := new(pb.ExchangeRequest)
			err := stream.RecvMsg(m)
			return m.GetFrame(), err
		}
	}
	return l
}

// start runs the sender and the receiver.
func (l *Link) start() {
	l.wg.Add(2)
	go l.sender()
	go l.receiver()
}

func (l *Link) String() string {
	return fmt.Sprintf("pipeline link of job %q generation %d, stage %d to stage %d", l.job, l.gen, l.self, l.peer)
}

// fail breaks the link for the first reason given. tell sends the peer
// an abort frame saying why (the client; the server's handler ends the
// stream with a status instead).
func (l *Link) fail(err error, tell bool) {
	l.deadOnce.Do(func() {
		l.deadErr = err
		close(l.dead)
		if !l.client {
			return // the handler returns the status, which ends the stream
		}
		if tell {
			select {
			case l.abortCh <- l.wrap(&pb.PipelineFrame{JobId: l.job, Generation: l.gen, Stage: uint32(l.self), Abort: err.Error()}):
				// abortGrace bounds how long the stream outlives the abort frame.
				l.grace = time.AfterFunc(abortGrace, l.cancel)
				return
			default:
			}
		}
		l.cancel()
	})
}

// gone is the error for a link the peer ended or that broke under it.
func (l *Link) gone(cause error) error {
	return &stage.PeerError{Stage: l.peer, Err: fmt.Errorf("%w: %w", stage.ErrPeerGone, cause)}
}

func (l *Link) sender() {
	defer l.wg.Done()
	for {
		select {
		case m := <-l.out:
			if err := l.stream.SendMsg(m); err != nil {
				// io.EOF hides the stream's status; the receiver reports it.
				if !errors.Is(err, io.EOF) {
					l.fail(l.gone(err), false)
				}
				return
			}
		case m := <-l.abortCh:
			// Best effort: the link is broken either way. The stream is
			// half-closed, not cancelled, so that the abort frame reaches
			// the peer before the stream's end does: the peer's handler
			// ends the stream, or abortGrace cancels it.
			_ = l.stream.SendMsg(m)
			if l.closeSend != nil {
				_ = l.closeSend()
			}
			return
		case <-l.ctx.Done():
			l.fail(l.gone(context.Cause(l.ctx)), false)
			return
		}
	}
}

func (l *Link) receiver() {
	defer l.wg.Done()
	for {
		f, err := l.recv()
		if err != nil {
			// After this end's own abort the failure is already recorded;
			// otherwise the peer ended the stream or went away.
			if errors.Is(err, io.EOF) {
				err = errors.New("it closed the stream")
			}
			l.fail(l.gone(err), false)
			return
		}
		if err := l.checkTags(f); err != nil {
			l.fail(&stage.PeerError{Stage: l.peer, Err: err}, true)
			return
		}
		if f.GetAbort() != "" {
			l.fail(l.gone(fmt.Errorf("it aborted the link: %s", f.GetAbort())), false)
			return
		}
		select {
		case l.inbox <- f:
		case <-l.ctx.Done():
			// This end aborted (recorded already), or the stream ended under it.
			l.fail(l.gone(context.Cause(l.ctx)), false)
			return
		}
	}
}

// checkTags refuses a frame that does not belong on this link.
func (l *Link) checkTags(f *pb.PipelineFrame) error {
	switch {
	case f == nil:
		return &stage.HeaderError{Msg: "a message without a frame"}
	case f.GetJobId() != l.job:
		return &stage.HeaderError{Msg: fmt.Sprintf("frame for job %q on a link of job %q", f.GetJobId(), l.job)}
	case f.GetGeneration() != l.gen:
		return &stage.HeaderError{Stale: f.GetGeneration() < l.gen,
			Msg: fmt.Sprintf("frame from generation %d on a link of generation %d", f.GetGeneration(), l.gen)}
	case int64(f.GetStage()) != int64(l.peer):
		return &stage.HeaderError{Msg: fmt.Sprintf("frame says it is from stage %d; this link's peer is stage %d", f.GetStage(), l.peer)}
	case f.GetAbort() == "" && f.GetDirection() != l.recvDir:
		return &stage.HeaderError{Msg: fmt.Sprintf("frame of direction %v; stage %d sends only %v here", f.GetDirection(), l.peer, l.recvDir)}
	}
	return nil
}

func toPB(d stage.Direction) pb.PipelineDirection {
	switch d {
	case stage.Activation:
		return pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION
	case stage.Gradient:
		return pb.PipelineDirection_PIPELINE_DIRECTION_GRADIENT
	}
	return pb.PipelineDirection_PIPELINE_DIRECTION_UNSPECIFIED
}

// broken is the error of an operation on a broken link.
func (l *Link) broken() error {
	var pe *stage.PeerError
	if errors.As(l.deadErr, &pe) {
		return l.deadErr
	}
	return fmt.Errorf("%v: %w: %w", l, stage.ErrAborted, l.deadErr)
}

// Send implements stage.Link: it cuts data into frames of at most
// FrameElems values, copies each and queues it for the sender; it returns
// once the last is queued.
func (l *Link) Send(ctx context.Context, h stage.Header, data []float32) error {
	if len(data) != h.Len() {
		return fmt.Errorf("peerrpc: sending %d values under a header of shape %d×%d", len(data), h.Shape[0], h.Shape[1])
	}
	if toPB(h.Dir) != l.sendDir {
		return fmt.Errorf("peerrpc: stage %d cannot send %vs to stage %d", l.self, h.Dir, l.peer)
	}
	for off := 0; ; off += FrameElems {
		end := min(off+FrameElems, len(data))
		f := &pb.PipelineFrame{JobId: l.job, Generation: l.gen, Stage: uint32(l.self), Direction: l.sendDir,
			Step: h.Step, MicroBatch: uint32(h.MicroBatch), Shape: []uint64{uint64(h.Shape[0]), uint64(h.Shape[1])},
			Offset: uint64(off), Last: end == len(data), Data: wire.PutF32(make([]byte, 4*(end-off)), data[off:end]), Eval: h.Eval}
		select {
		case <-l.dead:
			return l.broken()
		default:
		}
		select {
		case l.out <- l.wrap(f):
		case <-l.dead:
			return l.broken()
		case <-ctx.Done():
			return fmt.Errorf("sending the %v to stage %d: %w", h, l.peer, context.Cause(ctx))
		}
		if end == len(data) {
			return nil
		}
	}
}

// Recv implements stage.Link. A frame that is not the next one want
// describes breaks the link: the peer hears why (Aborted for an earlier
// generation or step, InvalidArgument otherwise) and Recv returns a
// *stage.PeerError wrapping the *stage.HeaderError.
func (l *Link) Recv(ctx context.Context, want stage.Header, dst []float32) error {
	if len(dst) != want.Len() {
		return fmt.Errorf("peerrpc: receiving the %v into %d values", want, len(dst))
	}
	if toPB(want.Dir) != l.recvDir {
		return fmt.Errorf("peerrpc: stage %d receives no %vs from stage %d", l.self, want.Dir, l.peer)
	}
	for got := 0; ; {
		var f *pb.PipelineFrame
		select {
		case f = <-l.inbox:
		case <-l.dead:
			// Frames that arrived before the break are still delivered.
			select {
			case f = <-l.inbox:
			default:
				return l.broken()
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for the %v from stage %d: %w", want, l.peer, context.Cause(ctx))
		}
		next, last, err := take(f, want, dst, got)
		if err != nil {
			l.fail(&stage.PeerError{Stage: l.peer, Err: err}, true)
			return l.broken()
		}
		if got = next; last {
			return nil
		}
	}
}

// take checks f as the frame of want's tensor that starts at element got
// (checkFrame) and copies its values into dst, the whole tensor; it
// returns where the next frame must start and whether f was the last.
func take(f *pb.PipelineFrame, want stage.Header, dst []float32, got int) (next int, last bool, err error) {
	n, last, err := checkFrame(f, want, got)
	if err != nil {
		return got, false, err
	}
	if err := wire.GetF32(dst[got:got+n], f.GetData()); err != nil {
		panic(err) // checkFrame checked the length
	}
	return got + n, last, nil
}

// checkFrame checks f as the frame of want's tensor that starts at
// element got, and returns how many values it carries and whether it is
// the last. Errors are *stage.HeaderError.
func checkFrame(f *pb.PipelineFrame, want stage.Header, got int) (n int, last bool, err error) {
	sh := f.GetShape()
	if len(sh) != 2 || sh[0] > 1<<31 || sh[1] > 1<<31 {
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("frame shape %v; want two dimensions (samples, values per sample), each at most 2^31", sh)}
	}
	h := stage.Header{Step: f.GetStep(), MicroBatch: int(f.GetMicroBatch()), Dir: want.Dir, Shape: [2]int{int(sh[0]), int(sh[1])}, Eval: f.GetEval()}
	if err := want.Check(h); err != nil {
		return 0, false, err
	}
	data := f.GetData()
	total := want.Len()
	switch {
	case len(data)%4 != 0:
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("frame carries %d bytes, not a whole number of float32 values", len(data))}
	case len(data) > 4*FrameElems:
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("frame carries %d bytes; at most %d allowed", len(data), 4*FrameElems)}
	case f.GetOffset() != uint64(got):
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("frame at offset %d of the %v; want offset %d (frames in order)", f.GetOffset(), want, got)}
	case got+len(data)/4 > total:
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("frame covers [%d, %d), outside the %v's %d values", got, got+len(data)/4, want, total)}
	case f.GetLast() && got+len(data)/4 != total:
		return 0, false, &stage.HeaderError{Msg: fmt.Sprintf("last frame ends at %d of the %v's %d values", got+len(data)/4, want, total)}
	case !f.GetLast() && len(data) == 0:
		return 0, false, &stage.HeaderError{Msg: "an empty frame that is not the last"}
	}
	return len(data) / 4, f.GetLast(), nil
}

// Abort implements stage.Link.
func (l *Link) Abort(cause error) {
	if cause == nil {
		cause = errors.New("aborted")
	}
	l.fail(cause, true)
}

// Close aborts the link (if it is not broken yet), ends its stream and
// waits for its goroutines.
func (l *Link) Close() {
	l.Abort(fmt.Errorf("stage %d closed the link", l.self))
	l.cancel() // an abort frame not yet written may be lost
	l.wg.Wait()
	l.cancel()
	if l.grace != nil {
		l.grace.Stop()
	}
}

// statusOf is the status a server link's handler ends its stream with.
func statusOf(err error) error {
	var he *stage.HeaderError
	var pe *stage.PeerError
	switch {
	case errors.As(err, &he) && he.Stale:
		return status.Error(codes.Aborted, err.Error())
	case errors.As(err, &he):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.As(err, &pe) && errors.Is(err, stage.ErrPeerGone):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Aborted, err.Error())
}
