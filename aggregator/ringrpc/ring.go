package ringrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
)

// Defaults of RingConfig.
const (
	// DefaultInboxFrames frames wait at most in a ring's inbox.
	DefaultInboxFrames = 4
	// DefaultOutboxFrames is RingConfig.OutboxFrames's default; the
	// setting no longer has an effect.
	DefaultOutboxFrames = 4
	// maxQueueFrames bounds both, so that a ring holds at most about
	// 2·64·4 MiB.
	maxQueueFrames = 64
)

// releaseGrace is how long a SendRight that gives up (its context ended,
// or the link broke) still waits for gRPC to finish with the caller's
// data. A neighbour that reads takes about a millisecond per MiB; one that
// does not will not take it any sooner.
const releaseGrace = 100 * time.Millisecond

// Socket buffer sizes for streams that carry frames: large writes and reads
// cut the system calls per 4 MiB frame from hundreds to a handful.
const (
	bulkWriteBuffer = 1 << 20
	bulkReadBuffer  = 1 << 20
)

// RingConfig says which ring to join. The zero values of the optional
// fields give the documented defaults.
type RingConfig struct {
	// JobID and Generation name the ring; every rank must agree on them.
	// A ring for a job replaces that job's ring of an older generation on
	// the same Endpoint.
	JobID      string
	Generation uint64
	// Rank is this process's rank in [0, len(Peers)).
	Rank int
	// Peers are the Collective endpoints' addresses (gRPC targets) by
	// rank; this rank connects to Peers[(Rank+1) % len(Peers)] only.
	Peers []string
	// DialOptions are appended to this package's defaults (shared gRPC
	// options from internal/rpc, insecure transport credentials, bulk
	// buffer sizes, fast reconnects), so they may override any of them,
	// transport credentials included.
	DialOptions []grpc.DialOption
	// InboxFrames bounds the frames received but not yet taken by
	// RecvLeft; 0 means DefaultInboxFrames.
	InboxFrames int
	// OutboxFrames is accepted for compatibility and ignored: SendRight
	// no longer queues copies of frames. It hands gRPC the caller's data
	// itself and returns once gRPC has written it (see SendRight).
	OutboxFrames int
}

// Validate reports whether c is usable.
func (c RingConfig) Validate() error {
	switch {
	case c.JobID == "":
		return errors.New("ringrpc: RingConfig.JobID is required")
	case len(c.JobID) > 128:
		return fmt.Errorf("ringrpc: RingConfig.JobID is %d bytes long; at most 128 allowed", len(c.JobID))
	case len(c.Peers) == 0:
		return errors.New("ringrpc: RingConfig.Peers is empty; want one address per rank")
	case c.Rank < 0 || c.Rank >= len(c.Peers):
		return fmt.Errorf("ringrpc: RingConfig.Rank %d out of range [0, %d)", c.Rank, len(c.Peers))
	case c.InboxFrames < 0 || c.InboxFrames > maxQueueFrames:
		return fmt.Errorf("ringrpc: RingConfig.InboxFrames %d out of range: want 0 (default %d) to %d", c.InboxFrames, DefaultInboxFrames, maxQueueFrames)
	case c.OutboxFrames < 0 || c.OutboxFrames > maxQueueFrames:
		return fmt.Errorf("ringrpc: RingConfig.OutboxFrames %d out of range: want 0 (default %d) to %d", c.OutboxFrames, DefaultOutboxFrames, maxQueueFrames)
	}
	for i, p := range c.Peers {
		if p == "" {
			return fmt.Errorf("ringrpc: RingConfig.Peers[%d] is empty", i)
		}
	}
	return nil
}

// DialOptions are the client options a ring uses before
// RingConfig.DialOptions: internal/rpc's shared options (message limits,
// HTTP/2 windows, keepalive), insecure credentials, 1 MiB socket buffers
// and reconnects within 0.5 s while peers start.
func DialOptions() []grpc.DialOption {
	return append(rpc.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithWriteBufferSize(bulkWriteBuffer),
		grpc.WithReadBufferSize(bulkReadBuffer),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
}

// ServerOptions are the options to add to internal/rpc.ServerOptions on a
// server that hosts an Endpoint: socket buffers sized for 4 MiB frames, and
// receive buffers that are not cleared before gRPC fills them
// (framecodec.FramePool).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.WriteBufferSize(bulkWriteBuffer),
		grpc.ReadBufferSize(bulkReadBuffer),
		experimental.BufferPool(&framecodec.FramePool{}),
	}
}

// Ring is this process's rank of one job's ring: an aggregator.Ring over
// gRPC. SendRight and RecvLeft follow the aggregator.Ring contract; Close
// and Shutdown may be called from any goroutine.
type Ring struct {
	e           *Endpoint
	job         string
	gen         uint64
	rank, n     int
	left, right int
	peers       []string

	// ctx lives as long as the ring; cancel (Close) ends the outbound stream
	// and wakes every blocked call and goroutine.
	ctx    context.Context
	cancel context.CancelFunc

	mu           sync.Mutex // protects closed, leftAttached, leftErr (and closing leftDone)
	closed       bool
	leftAttached bool
	leftErr      error
	leftEOF      bool          // the left neighbour half-closed its stream in order
	leftUp       chan struct{} // closed when the left neighbour's stream was accepted
	leftDone     chan struct{} // closed when that stream ended; leftErr says why

	wg        sync.WaitGroup // the sender and the watcher
	closeOnce sync.Once

	// Outbound: one stream to the right neighbour.
	conn     *grpc.ClientConn
	stream   grpc.ClientStream
	out      chan *outFrame // frames for the sender goroutine, in order
	spare    *outFrame      // an idle outFrame; only SendRight touches it
	flush    chan struct{}  // closed by Shutdown: drain out, then half-close
	flushOne sync.Once
	acked    chan struct{} // closed when the right neighbour acknowledged a half-close
	sendDone chan struct{} // closed when the outbound link broke; sendErr says why
	sendErr  error
	sendOne  sync.Once

	// broken is closed when a link broke out of order while the ring was
	// open; brokenErr (written once, before the close) says why.
	broken     chan struct{}
	brokenErr  error
	brokenOnce sync.Once

	// Inbound: frames from the left neighbour's stream.
	inbox  chan *inFrame
	inFree chan *inFrame
	last   *inFrame // returned by the last RecvLeft; only RecvLeft(Into) touches it

	// Data bytes handed to SendRight and returned by RecvLeft.
	sentBytes, recvBytes atomic.Int64
	// Frames handed to SendRight, and frames that arrived from the left
	// neighbour (accepted by the inbound handler, taken or not).
	framesOut, framesIn atomic.Int64
	lastIn              atomic.Int64 // Unix nanoseconds of the last arrival from the left (or of Join)
	// aborted: a SendRight or RecvLeft failed (its caller's context
	// ended, or a link broke), so a collective stopped half-way and
	// Shutdown has no last frames to deliver.
	aborted atomic.Bool

	// Left waits: how long RecvLeft blocked for the first frame of each
	// collective (a frame whose op or step differs from the previous
	// one's). Only RecvLeft writes curOp and curStep.
	curOp       aggregator.OpKind
	curStep     int64
	waitNanos   atomic.Int64
	collectives atomic.Int64
}

// Broken returns a channel that is closed when a link of this ring
// breaks out of order while the ring is open: the left neighbour's stream
// ended without a half-close, or the outbound link failed before the
// right neighbour acknowledged one. It is never closed by this rank's own
// Close or by an orderly Shutdown of the ring. BrokenErr then says why (a
// *aggregator.PeerError naming the neighbour). A rank that makes no calls
// learns from it that its ring is gone: the agent of a script that stopped
// calling uses it to tell that its peers gave up waiting.
func (r *Ring) Broken() <-chan struct{} { return r.broken }

// BrokenErr is why Broken's channel was closed (nil before).
func (r *Ring) BrokenErr() error {
	select {
	case <-r.broken:
		return r.brokenErr
	default:
		return nil
	}
}

// WaitStats reports over how many collectives this rank has received
// frames, and how long in all it waited for the left neighbour's first
// frame of each: RecvLeft is first called when this rank is ready (it has
// queued its own first frames), so the wait measures how much later than
// this rank the left neighbour became ready — in a reduce-scatter a rank
// sends its first chunk at once and needs only the left neighbour's.
// The cost is one clock reading per RecvLeft that has to block.
func (r *Ring) WaitStats() (collectives int64, waited time.Duration) {
	return r.collectives.Load(), time.Duration(r.waitNanos.Load())
}

// FrameCounts reports the frames handed to SendRight and the frames that
// arrived from the left neighbour. Every frame rank r sends is one that
// rank r+1 receives, so once a ring has stalled, r's sent count above
// r+1's arrived count says the link r → r+1 lost frames.
func (r *Ring) FrameCounts() (sent, arrived int64) {
	return r.framesOut.Load(), r.framesIn.Load()
}

// LeftIdle is how long ago the last frame arrived from the left neighbour
// (or the ring was joined, if none has): a link that lost frames has been
// idle since.
func (r *Ring) LeftIdle() time.Duration {
	return time.Since(time.Unix(0, r.lastIn.Load()))
}

// Traffic reports the tensor bytes this rank has sent to its right
// neighbour and received from its left one, and their addresses.
func (r *Ring) Traffic() (sent, received int64, right, left string) {
	return r.sentBytes.Load(), r.recvBytes.Load(), r.peers[r.right], r.peers[r.left]
}

// Rank implements aggregator.Ring.
func (r *Ring) Rank() int { return r.rank }

// Size implements aggregator.Ring.
func (r *Ring) Size() int { return r.n }

// JobID and Generation name the ring.
func (r *Ring) JobID() string { return r.job }

// Generation is the ring's membership generation.
func (r *Ring) Generation() uint64 { return r.gen }

// SendRight implements aggregator.Ring without copying f.Data: gRPC
// writes the caller's values straight from f.Data (on little-endian
// machines), and SendRight returns once gRPC is done with them, that is
// once the whole frame is in the connection's write buffer or the socket.
//
// If SendRight fails (ctx ended, the link broke, the ring was closed)
// while gRPC is still writing the frame, it waits up to releaseGrace for
// gRPC to finish; after that gRPC may go on reading f.Data until the ring
// is closed (Close returns only once gRPC has let go of it). A failed
// SendRight leaves the ring aborted, so no later call needs the frame.
func (r *Ring) SendRight(ctx context.Context, f aggregator.Frame) error {
	err := r.sendRight(ctx, f)
	if err != nil {
		r.aborted.Store(true)
	}
	return err
}

func (r *Ring) sendRight(ctx context.Context, f aggregator.Frame) error {
	if len(f.Data) > wire.MaxFrameBytes/4 {
		return fmt.Errorf("ringrpc: frame of %d float32 values; at most %d allowed", len(f.Data), wire.MaxFrameBytes/4)
	}
	if r.n == 1 {
		return errors.New("ringrpc: a ring of one rank has no neighbour to send to")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-r.ctx.Done():
		return aggregator.ErrClosed
	case <-r.sendDone:
		return r.sendErr
	default:
	}
	o := r.spare
	if o == nil { // the last one was abandoned to gRPC
		o = newOutFrame()
	}
	r.spare = nil
	o.state.Store(outQueued)
	o.encode(r.job, r.rank, f)
	var err error
	select {
	case r.out <- o:
		r.sentBytes.Add(int64(4 * len(f.Data)))
		r.framesOut.Add(1)
		select {
		case <-o.Released():
			r.spare = o
			return nil
		case <-ctx.Done():
			err = ctx.Err()
		case <-r.ctx.Done():
			err = aggregator.ErrClosed
		case <-r.sendDone:
			err = r.sendErr
		}
	case <-ctx.Done():
		return ctx.Err() // o was not queued: spare stays nil, o is dropped
	case <-r.ctx.Done():
		return aggregator.ErrClosed
	case <-r.sendDone:
		return r.sendErr
	}
	if o.state.CompareAndSwap(outQueued, outAbandoned) {
		return err // the sender will skip it; gRPC never saw it
	}
	t := time.NewTimer(releaseGrace)
	defer t.Stop()
	select {
	case <-o.Released():
		r.spare = o
	case <-t.C: // o stays with gRPC until the ring is closed
	}
	return err
}

// RecvLeft implements aggregator.Ring. Frames that arrived before the left
// link broke are delivered before the error.
func (r *Ring) RecvLeft(ctx context.Context) (aggregator.Frame, error) {
	in, err := r.recvLeft(ctx)
	if err != nil {
		r.aborted.Store(true)
		return aggregator.Frame{}, err
	}
	r.last = in
	return in.frame(), nil
}

// RecvLeftInto implements aggregator.ReducingRing: the values are added
// or copied into dst straight from gRPC's receive buffers.
func (r *Ring) RecvLeftInto(ctx context.Context, dst []float32, add bool, accept func(aggregator.Frame, int) error) error {
	in, err := r.recvLeft(ctx)
	if err != nil {
		r.aborted.Store(true)
		return err
	}
	r.last = in
	if err := accept(in.tags(), in.NBytes/4); err != nil {
		return err
	}
	if len(dst) != in.NBytes/4 {
		return fmt.Errorf("ringrpc: RecvLeftInto: accept let %d values into %d places", in.NBytes/4, len(dst))
	}
	in.combineInto(dst, add)
	return nil
}

// recvLeft returns the next frame from the inbox, after recycling the one
// the previous call returned.
func (r *Ring) recvLeft(ctx context.Context) (*inFrame, error) {
	if r.last != nil {
		r.last.release()
		r.inFree <- r.last // room: every inFrame fits
		r.last = nil
	}
	if r.n == 1 {
		return nil, errors.New("ringrpc: a ring of one rank has no neighbour to receive from")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case in := <-r.inbox:
		return r.take(in, 0), nil
	default:
	}
	start := time.Now()
	select {
	case in := <-r.inbox:
		return r.take(in, time.Since(start)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.ctx.Done():
		return nil, aggregator.ErrClosed
	case <-r.leftDone:
		select {
		case in := <-r.inbox:
			return r.take(in, time.Since(start)), nil
		default:
		}
		return nil, r.leftErr
	}
}

// take accounts for in, which RecvLeft blocked for waited to get.
func (r *Ring) take(in *inFrame, waited time.Duration) *inFrame {
	r.recvBytes.Add(int64(in.NBytes))
	op := opFromPB(in.Op)
	if op != r.curOp || in.Step != r.curStep { // the first frame of a collective
		r.curOp, r.curStep = op, in.Step
		r.collectives.Add(1)
		r.waitNanos.Add(int64(waited))
	}
	return in
}

// Shutdown ends the ring in order, when every rank calls it after the
// last collective: frames already handed to SendRight are written, the
// stream to the right neighbour is half-closed, and Shutdown waits (at
// most until ctx ends) until the right neighbour has acknowledged them
// all and the left neighbour has half-closed its stream too, so that no
// rank tears down a link its neighbour still needs. Then it closes the
// ring as Close does. After a collective was abandoned half-way (a call's
// context ended — a step timeout, a cancelled task — or a link broke)
// there are no last frames anyone needs, and a stalled link would only
// hold Shutdown up, so it closes at once.
func (r *Ring) Shutdown(ctx context.Context) error {
	defer r.Close()
	if r.n == 1 {
		return nil
	}
	if r.aborted.Load() {
		return fmt.Errorf("ringrpc: %v closed without flushing: a collective was abandoned", r)
	}
	r.flushOne.Do(func() { close(r.flush) })
	var errs []error
	select {
	case <-r.acked:
	case <-r.sendDone:
		select {
		case <-r.acked:
		default:
			errs = append(errs, r.sendErr)
		}
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("ringrpc: shutdown of %v: waiting for rank %d to take the last frames: %w", r, r.right, ctx.Err()))
	case <-r.ctx.Done():
		return aggregator.ErrClosed
	}
	select {
	case <-r.leftDone:
		r.mu.Lock()
		eof := r.leftEOF
		r.mu.Unlock()
		if !eof {
			errs = append(errs, r.leftErr)
		}
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("ringrpc: shutdown of %v: waiting for rank %d to close its stream: %w", r, r.left, ctx.Err()))
	case <-r.ctx.Done():
		return aggregator.ErrClosed
	}
	return errors.Join(errs...)
}

// Close breaks this rank at once, as if its process died: the stream to
// the right neighbour is cancelled, the left neighbour's stream is refused
// from its next frame, calls in progress return aggregator.ErrClosed and
// the neighbours' calls fail with a *aggregator.PeerError naming this
// rank. Close waits for the ring's own goroutines; an inbound handler
// blocked in the left neighbour's stream returns as soon as that stream
// delivers or ends. Close is idempotent and returns nil.
func (r *Ring) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.cancel()
		r.e.unregister(r)
		r.wg.Wait()
		if r.conn != nil {
			r.conn.Close()
		}
	})
	return nil
}

var _ aggregator.ReducingRing = (*Ring)(nil)
