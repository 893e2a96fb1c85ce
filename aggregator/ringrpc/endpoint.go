package ringrpc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Request metadata of a SendFrames stream: which ring it feeds and who
// sends. The ASCII keys are lower case as gRPC requires.
const (
	mdJob        = rpc.MDJob
	mdGeneration = rpc.MDGeneration
	mdRank       = "gradsync-rank"
	// mdAccepted is the response header by which an Endpoint accepts a
	// stream.
	mdAccepted = rpc.MDAccepted
)

// Endpoint is a worker's Collective service: the receiving end of every
// ring this process takes part in. Register it on the worker's gRPC server
// with pb.RegisterCollectiveServer; Join adds rings to it. Safe for
// concurrent use. The zero value is not usable; call NewEndpoint.
type Endpoint struct {
	pb.UnimplementedCollectiveServer
	log *slog.Logger

	mu     sync.Mutex       // protects rings and closed
	rings  map[string]*Ring // the current ring of each job, by job id
	closed bool
}

// NewEndpoint returns an Endpoint with no rings. log may be nil.
func NewEndpoint(log *slog.Logger) *Endpoint {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Endpoint{log: log, rings: map[string]*Ring{}}
}

// Close closes every ring of e (as Ring.Close does) and makes later Joins
// fail. Streams still open to e are refused at their next frame. Close is
// idempotent and returns nil.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	e.closed = true
	rings := make([]*Ring, 0, len(e.rings))
	for _, r := range e.rings {
		rings = append(rings, r)
	}
	e.mu.Unlock()
	for _, r := range rings {
		r.Close()
	}
	return nil
}

// register makes r its job's ring; an older generation's ring is returned
// for the caller to close.
func (e *Endpoint) register(r *Ring) (old *Ring, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("ringrpc: endpoint closed")
	}
	old = e.rings[r.job]
	if old != nil && old.gen >= r.gen {
		return nil, status.Errorf(codes.FailedPrecondition,
			"ringrpc: job %q already has a ring at generation %d on this endpoint; a new ring needs a higher generation than %d",
			r.job, old.gen, r.gen)
	}
	e.rings[r.job] = r
	return old, nil
}

func (e *Endpoint) unregister(r *Ring) {
	e.mu.Lock()
	if e.rings[r.job] == r {
		delete(e.rings, r.job)
	}
	e.mu.Unlock()
}

// SendFrames implements pb.CollectiveServer: the left neighbour's stream
// into one of e's rings. The handler is the stream's receiver: it checks
// each frame and queues it in the ring's inbox, blocking while the inbox
// is full (which holds back the sender through HTTP/2 flow control).
func (e *Endpoint) SendFrames(stream pb.Collective_SendFramesServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	job, gen, rank, err := streamTags(md)
	if err != nil {
		return err
	}
	r, err := e.attach(job, gen, rank)
	if err != nil {
		return err
	}
	// Response headers tell the sender's Join that the link is accepted.
	if err := stream.SendHeader(metadata.Pairs(mdAccepted, "1")); err != nil {
		r.leftEnded(r.peerGone(r.left, err), false)
		return err
	}
	return r.serve(stream, framecodec.InMetadata(md))
}

// streamTags reads the stream's metadata.
func streamTags(md metadata.MD) (job string, gen uint64, rank int, err error) {
	return rpc.StreamTags(md, "ringrpc: SendFrames", mdRank, "rank", math.MaxInt32)
}

// attach binds a new inbound stream to its ring, or says why not.
func (e *Endpoint) attach(job string, gen uint64, rank int) (*Ring, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rings[job]
	switch {
	case r == nil:
		return nil, status.Errorf(codes.NotFound, "ringrpc: no ring for job %q on this endpoint", job)
	case gen < r.gen:
		return nil, status.Errorf(codes.Aborted, "ringrpc: stale generation %d for job %q: this endpoint's ring is at generation %d", gen, job, r.gen)
	case gen > r.gen:
		return nil, status.Errorf(codes.NotFound, "ringrpc: no ring for job %q at generation %d on this endpoint yet (it has generation %d)", job, gen, r.gen)
	case rank != r.left:
		return nil, status.Errorf(codes.FailedPrecondition, "ringrpc: job %q: rank %d may not send to rank %d; only its left neighbour, rank %d, may", job, rank, r.rank, r.left)
	}
	return r, r.attachLeft()
}

// serve receives frames from the left neighbour until the stream or the
// ring ends.
func (r *Ring) serve(stream pb.Collective_SendFramesServer, fast bool) error {
	var count uint64
	for {
		var in *inFrame
		select {
		case in = <-r.inFree:
		case <-r.ctx.Done():
			return r.closedStatus()
		}
		var err error
		if fast {
			err = stream.RecvMsg(in)
		} else {
			// A new message each time: in keeps a view of its data.
			req := new(pb.SendFramesRequest)
			if err = stream.RecvMsg(req); err == nil {
				in.fromProto(req)
			}
		}
		if err != nil {
			r.inFree <- in // there is room: in came from there
			if errors.Is(err, io.EOF) {
				// The neighbour closed its end in order (Shutdown).
				r.leftEnded(r.peerGone(r.left, errors.New("it closed its stream")), true)
				return stream.SendAndClose(&pb.SendFramesResponse{Frames: count})
			}
			if r.ctx.Err() != nil {
				return r.closedStatus()
			}
			r.leftEnded(r.peerGone(r.left, err), false)
			return err
		}
		if err := r.checkFrame(in); err != nil {
			in.release()
			r.inFree <- in
			r.leftEnded(r.peerGone(r.left, err), false)
			return err
		}
		r.framesIn.Add(1)
		r.lastIn.Store(time.Now().UnixNano())
		select {
		case r.inbox <- in:
			count++
		case <-r.ctx.Done():
			return r.closedStatus()
		}
	}
}

func (r *Ring) closedStatus() error {
	r.leftEnded(aggregator.ErrClosed, false)
	return status.Errorf(codes.Unavailable, "ringrpc: rank %d closed its ring for job %q (generation %d)", r.rank, r.job, r.gen)
}

// checkFrame refuses a frame that does not belong on this link; a refused
// frame never reaches the inbox.
func (r *Ring) checkFrame(in *inFrame) error {
	switch {
	case string(in.JobID) != r.job:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame for job %q on a stream of job %q", in.JobID, r.job)
	case in.Generation < r.gen:
		// A newer generation is left to the collective, which requires
		// exactly its call's Options.Generation (ErrUnexpectedFrame).
		return status.Errorf(codes.Aborted, "ringrpc: frame from stale generation %d; job %q is at generation %d", in.Generation, r.job, r.gen)
	case int(in.Rank) != r.left:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame says it is from rank %d; this stream is from rank %d", in.Rank, r.left)
	case opFromPB(in.Op) == 0:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame op %v is not a ring collective (allowed: OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER)", in.Op)
	case in.HasData && in.DType != pb.DType_D_TYPE_F32:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame dtype %v; ring collectives carry D_TYPE_F32 only", in.DType)
	case in.NBytes%4 != 0:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame carries %d data bytes, not a whole number of float32", in.NBytes)
	case in.Offset > 1<<62:
		return status.Errorf(codes.InvalidArgument, "ringrpc: frame offset %d out of range", in.Offset)
	}
	return nil
}

func (r *Ring) String() string {
	return fmt.Sprintf("ring{job %q gen %d rank %d/%d}", r.job, r.gen, r.rank, r.n)
}
