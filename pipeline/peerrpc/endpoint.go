package peerrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/rpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Request metadata of an Exchange stream, and the response header by
// which an Endpoint accepts it.
const (
	mdJob        = rpc.MDJob
	mdGeneration = rpc.MDGeneration
	mdStage      = "gradsync-stage"
	mdAccepted   = rpc.MDAccepted
)

// Endpoint is a worker's Pipeline service: the receiving end of the
// links from previous stages. Register it with pb.RegisterPipelineServer;
// Accept waits for one link. Safe for concurrent use. The zero value is
// not usable; call NewEndpoint.
type Endpoint struct {
	pb.UnimplementedPipelineServer

	mu     sync.Mutex // protects waits and closed
	waits  map[acceptKey]*acceptance
	closed bool
}

// acceptKey names a link an Endpoint waits for: the job and the stage
// that receives it.
type acceptKey struct {
	job   string
	stage int
}

type acceptance struct {
	gen uint64
	got chan *Link // buffered: the handler never blocks on it
}

// NewEndpoint returns an Endpoint that waits for no link yet.
func NewEndpoint() *Endpoint { return &Endpoint{waits: map[acceptKey]*acceptance{}} }

// Close makes later Accepts and streams fail. Links already accepted
// belong to their callers, who Close them.
func (e *Endpoint) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
}

// Accept waits, under ctx, for stage−1's Exchange stream of job at
// generation gen and returns stage's end of that link (its Prev link).
// A stream that comes before Accept is refused with NotFound, and Dial
// retries it.
func (e *Endpoint) Accept(ctx context.Context, job string, gen uint64, stage int) (*Link, error) {
	if stage < 1 {
		return nil, fmt.Errorf("peerrpc: stage %d has no previous stage to accept a link from", stage)
	}
	k := acceptKey{job, stage}
	a := &acceptance{gen: gen, got: make(chan *Link, 1)}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return nil, errors.New("peerrpc: endpoint closed")
	case e.waits[k] != nil:
		e.mu.Unlock()
		return nil, fmt.Errorf("peerrpc: job %q stage %d already waits for its link here", job, stage)
	}
	e.waits[k] = a
	e.mu.Unlock()
	select {
	case l := <-a.got:
		return l, nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	if e.waits[k] == a {
		delete(e.waits, k)
		e.mu.Unlock()
		return nil, fmt.Errorf("peerrpc: job %q stage %d: stage %d did not connect: %w", job, stage, stage-1, context.Cause(ctx))
	}
	e.mu.Unlock()
	l := <-a.got // the handler took the acceptance just now
	l.Close()
	return nil, fmt.Errorf("peerrpc: job %q stage %d: %w", job, stage, context.Cause(ctx))
}

// Exchange implements pb.PipelineServer: the previous stage's stream. The
// handler hands the link to Accept, lets its sender and receiver run, and
// ends the stream, once the link breaks, with a status saying why.
func (e *Endpoint) Exchange(stream pb.Pipeline_ExchangeServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	job, gen, from, err := streamTags(md)
	if err != nil {
		return err
	}
	k := acceptKey{job, from + 1}
	e.mu.Lock()
	a := e.waits[k]
	switch {
	case e.closed:
		e.mu.Unlock()
		return status.Error(codes.Unavailable, "peerrpc: endpoint closed")
	case a == nil:
		e.mu.Unlock()
		return status.Errorf(codes.NotFound, "peerrpc: no stage %d of job %q waits for a link here", from+1, job)
	case gen < a.gen:
		e.mu.Unlock()
		return status.Errorf(codes.Aborted, "peerrpc: stale generation %d: job %q stage %d waits for generation %d", gen, job, from+1, a.gen)
	case gen > a.gen:
		e.mu.Unlock()
		return status.Errorf(codes.NotFound, "peerrpc: job %q stage %d waits for generation %d here, not %d yet", job, from+1, a.gen, gen)
	}
	delete(e.waits, k)
	e.mu.Unlock()
	l := newLink(stream.Context(), job, gen, from+1, from, false, stream)
	if err := stream.SendHeader(metadata.Pairs(mdAccepted, "1")); err != nil {
		l.fail(l.gone(err), false)
	}
	l.start()
	a.got <- l
	<-l.dead
	return statusOf(l.deadErr)
}

// streamTags reads an Exchange stream's metadata.
func streamTags(md metadata.MD) (job string, gen uint64, stage int, err error) {
	return rpc.StreamTags(md, "peerrpc: Exchange", mdStage, "stage", 1<<20)
}

// Dial opens stage's link to stage+1 of job at generation gen over conn
// (a connection to the next stage's worker) and returns stage's end (its
// Next link). It retries, until ctx ends, while the next stage has not
// called Accept yet; ctx bounds the connecting only, the link lives until
// Close.
func Dial(ctx context.Context, conn grpc.ClientConnInterface, job string, gen uint64, stage int) (*Link, error) {
	client := pb.NewPipelineClient(conn)
	md := metadata.Pairs(mdJob, job, mdGeneration, strconv.FormatUint(gen, 10), mdStage, strconv.Itoa(stage))
	pause := 5 * time.Millisecond
	for {
		l, err := open(ctx, client, md, job, gen, stage)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("peerrpc: job %q stage %d: connecting to stage %d: %w (last attempt: %v)", job, stage, stage+1, context.Cause(ctx), err)
		}
		if c := status.Code(err); c != codes.NotFound && c != codes.Unavailable {
			return nil, fmt.Errorf("peerrpc: job %q stage %d: stage %d refused the link: %w", job, stage, stage+1, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// open makes one attempt: a stream under the link's own lifetime whose
// acceptance (the response header) is awaited under ctx.
func open(ctx context.Context, client pb.PipelineClient, md metadata.MD, job string, gen uint64, stage int) (*Link, error) {
	lctx, lcancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	stop := context.AfterFunc(ctx, lcancel)
	defer stop()
	stream, err := client.Exchange(lctx, grpc.WaitForReady(true))
	if err == nil {
		var hdr metadata.MD
		// Header hides a refused stream's status; RecvMsg returns it.
		if hdr, err = stream.Header(); err == nil && len(hdr.Get(mdAccepted)) == 0 {
			if _, err = stream.Recv(); err == nil {
				err = status.Error(codes.Internal, "peerrpc: the next stage sent a frame without accepting the stream")
			}
		}
	}
	if err == nil && lctx.Err() == nil {
		l := newLink(lctx, job, gen, stage, stage+1, true, stream)
		l.closeSend = stream.CloseSend
		// lcancel stays reachable: l.cancel's parent is lctx, and Close
		// cancels both.
		parent := l.cancel
		l.cancel = func() { parent(); lcancel() }
		l.start()
		return l, nil
	}
	lcancel()
	if err == nil {
		err = lctx.Err()
	}
	return nil, err
}
