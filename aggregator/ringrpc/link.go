package ringrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Join adds this rank of cfg's ring to e and connects it: it opens the
// stream to the right neighbour (retrying while that peer is not up or has
// not joined yet) and waits for the left neighbour's stream, so a ring
// returned by Join is fully linked. ctx bounds the joining only; the ring
// lives until Close.
func (e *Endpoint) Join(ctx context.Context, cfg RingConfig) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := len(cfg.Peers)
	inbox := cfg.InboxFrames
	if inbox == 0 {
		inbox = DefaultInboxFrames
	}
	r := &Ring{
		e: e, job: cfg.JobID, gen: cfg.Generation, rank: cfg.Rank, n: n,
		left: (cfg.Rank + n - 1) % n, right: (cfg.Rank + 1) % n,
		peers:    append([]string(nil), cfg.Peers...),
		leftUp:   make(chan struct{}),
		leftDone: make(chan struct{}),
		out:      make(chan *outFrame, 1),
		spare:    newOutFrame(),
		flush:    make(chan struct{}),
		acked:    make(chan struct{}),
		sendDone: make(chan struct{}),
		broken:   make(chan struct{}),
		inbox:    make(chan *inFrame, inbox),
		inFree:   make(chan *inFrame, inbox+2),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.lastIn.Store(time.Now().UnixNano())
	// In circulation: inbox frames queued, one held by RecvLeft, one
	// being filled by the handler.
	for range inbox + 2 {
		r.inFree <- &inFrame{}
	}
	old, err := e.register(r)
	if err != nil {
		r.cancel()
		return nil, err
	}
	if old != nil {
		old.Close()
	}
	if n == 1 {
		return r, nil
	}
	if err := r.connect(ctx, cfg.DialOptions); err != nil {
		r.Close()
		return nil, err
	}
	select {
	case <-r.leftUp:
		return r, nil
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("ringrpc: job %q rank %d: left neighbour rank %d (%s) did not connect: %w", r.job, r.rank, r.left, r.peers[r.left], ctx.Err())
	}
}

// connect opens the stream to the right neighbour and starts its sender
// and watcher.
func (r *Ring) connect(ctx context.Context, extra []grpc.DialOption) error {
	target := r.peers[r.right]
	conn, err := grpc.NewClient(target, append(DialOptions(), extra...)...)
	if err != nil {
		return fmt.Errorf("ringrpc: right neighbour rank %d (%s): %w", r.right, target, err)
	}
	r.conn = conn
	client := pb.NewCollectiveClient(conn)
	md := metadata.Pairs(mdJob, r.job, mdGeneration, strconv.FormatUint(r.gen, 10), mdRank, strconv.Itoa(r.rank))
	pause := 10 * time.Millisecond
	for {
		stream, err := r.open(ctx, client, md)
		if err == nil {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.closed {
				return aggregator.ErrClosed
			}
			r.stream = stream
			r.wg.Add(2)
			go r.sender()
			go r.watch()
			return nil
		}
		if ctx.Err() != nil || r.ctx.Err() != nil {
			return fmt.Errorf("ringrpc: job %q rank %d: connecting to right neighbour rank %d (%s): %w (last attempt: %v)",
				r.job, r.rank, r.right, target, context.Cause(ctx), err)
		}
		if c := status.Code(err); c != codes.NotFound && c != codes.Unavailable {
			return fmt.Errorf("ringrpc: job %q rank %d: right neighbour rank %d (%s) refused the ring: %w", r.job, r.rank, r.right, target, err)
		}
		// Not joined there yet: try again shortly.
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		case <-r.ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// open makes one attempt: a stream under the ring's lifetime whose
// acceptance (response headers) is awaited under ctx.
func (r *Ring) open(ctx context.Context, client pb.CollectiveClient, md metadata.MD) (grpc.ClientStream, error) {
	sctx, scancel := context.WithCancel(metadata.NewOutgoingContext(r.ctx, md))
	stop := context.AfterFunc(ctx, scancel)
	defer stop()
	stream, err := client.SendFrames(sctx, grpc.CallContentSubtype(codecName), grpc.WaitForReady(true))
	if err == nil {
		// Header hides a failed stream's status (it returns no metadata
		// and no error); the status is then what RecvMsg returns.
		var hdr metadata.MD
		if hdr, err = stream.Header(); err == nil && len(hdr.Get(mdAccepted)) == 0 {
			var resp pb.SendFramesResponse
			if err = stream.RecvMsg(&resp); err == nil {
				err = status.Error(codes.Internal, "ringrpc: the peer ended the stream without accepting it")
			}
		}
	}
	if err == nil && sctx.Err() == nil {
		// scancel stays reachable through sctx's parent r.ctx: Close ends it.
		return stream, nil
	}
	scancel()
	if err == nil {
		err = sctx.Err()
	}
	return nil, err
}

// sender is the only goroutine that writes to the stream.
func (r *Ring) sender() {
	defer r.wg.Done()
	send := func(o *outFrame) bool {
		err := r.stream.SendMsg(o)
		if err == nil {
			return true
		}
		// io.EOF says only that the stream ended; the watcher is about to
		// report the status the neighbour ended it with, which says why.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-r.sendDone:
		case <-r.ctx.Done():
		case <-t.C:
			r.sendFailed(err)
		}
		return false
	}
	for {
		select {
		case o := <-r.out:
			if o.state.CompareAndSwap(outQueued, outSending) && !send(o) {
				return
			}
		case <-r.flush:
			for {
				select {
				case o := <-r.out:
					if o.state.CompareAndSwap(outQueued, outSending) && !send(o) {
						return
					}
				default:
					if err := r.stream.CloseSend(); err != nil {
						r.sendFailed(err)
					}
					return
				}
			}
		case <-r.ctx.Done():
			return
		}
	}
}

// watch is the stream's receiver: the response arrives only when the
// right neighbour ends the stream, after a half-close (an acknowledgement)
// or because it failed or refused a frame.
func (r *Ring) watch() {
	defer r.wg.Done()
	var resp pb.SendFramesResponse
	err := r.stream.RecvMsg(&resp)
	if err == nil {
		close(r.acked)
		err = errors.New("the stream was closed after Shutdown")
	}
	r.sendFailed(err)
}

// sendFailed records why the outbound link broke (the first reason wins).
func (r *Ring) sendFailed(err error) {
	r.sendOne.Do(func() {
		r.sendErr = r.peerGone(r.right, err)
		close(r.sendDone)
		select {
		case <-r.acked: // the right neighbour took the half-close: in order
		default:
			r.markBroken(r.sendErr)
		}
	})
}

// markBroken records that a link broke out of order while the ring was
// open (the first reason wins); a ring closed by this rank is not broken.
func (r *Ring) markBroken(err error) {
	if r.ctx.Err() != nil {
		return
	}
	r.brokenOnce.Do(func() {
		r.brokenErr = err
		close(r.broken)
	})
}

// peerGone is the error for a broken link to peer: a *PeerError naming it
// that wraps aggregator.ErrPeerGone and the cause, or ErrClosed when this
// ring was closed.
func (r *Ring) peerGone(peer int, cause error) error {
	if r.ctx.Err() != nil {
		return aggregator.ErrClosed
	}
	return &aggregator.PeerError{Rank: peer, Err: fmt.Errorf("%w (%s): %w", aggregator.ErrPeerGone, r.peers[peer], cause)}
}

// attachLeft marks the left neighbour's stream as connected.
func (r *Ring) attachLeft() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return status.Errorf(codes.NotFound, "ringrpc: the ring of job %q at generation %d on this endpoint is closed", r.job, r.gen)
	case r.leftAttached:
		return status.Errorf(codes.FailedPrecondition, "ringrpc: job %q generation %d: rank %d is already connected; a ring link is never re-opened (join a new generation)", r.job, r.gen, r.left)
	}
	r.leftAttached = true
	close(r.leftUp)
	return nil
}

// leftEnded records why the inbound link ended (the first reason wins);
// eof says it was an orderly half-close.
func (r *Ring) leftEnded(err error, eof bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leftErr == nil {
		r.leftEOF = eof
		r.leftErr = err
		close(r.leftDone)
		if !eof {
			r.markBroken(err) // already a *PeerError naming the left neighbour
		}
	}
}
