// Package agent is the local service a worker serves to the command it
// starts for an entrypoint job (a user's PyTorch script): the Agent gRPC
// service of proto/gradsync/v1/agent.proto on a Unix socket only the
// worker's user can open. The script computes; the agent communicates:
// every all-reduce, broadcast and barrier it is asked for runs through a
// Collective — in mode ring the job's ring of workers (aggregator's ring
// collectives over the worker's ring transport, OverRing), in mode ps the
// job's parameter-server shards, which sum the ranks' buckets as BytePS's
// servers do (paramserver.ScriptClient) — in the order of the calls'
// sequence numbers, so that a script may keep several buckets in flight
// while its backward pass runs.
//
// Bulk data goes through the socket as raw little-endian float32 bytes
// (at most MaxElements values a call), or through a shared-memory region
// of the registered layout's size (shm.go).
//
// With the job's compression (Config.Compression, mode ring) the
// all-reduces of shared-memory ranges are gradient buckets, compressed by
// the worker with a compress.Reducer per bucket that keeps its error
// feedback and PowerSGD state between steps (compress.go).
package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// MaxElements is the most float32 values one call carries (4 MiB, the
// frame bound of the wire rules).
const MaxElements = 1 << 20

// maxTensors bounds a registered layout.
const maxTensors = 1 << 16

// Config configures a Server.
type Config struct {
	// Collective carries the collectives (mode ps: the parameter
	// server's, paramserver.ScriptClient). Nil: OverRing(Ring).
	Collective Collective
	// Ring is this rank's view of the job's ring (mode ring); the Server
	// is its only user while it serves. Compression needs it.
	Ring aggregator.Ring
	// JobID and Generation identify the job; Generation tags every frame.
	JobID      string
	Generation uint64
	// StepTimeout bounds each collective, from the moment its call
	// arrives (waiting for its turn included). Default 60 s.
	StepTimeout time.Duration
	// Report receives the script's Report calls (progress, evaluations,
	// the final result); nil drops them. It must not block for long.
	Report func(*pb.ReportRequest)
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Peers are the ranks' addresses (optional): a collective that times
	// out names the rank that never joined it with its address.
	Peers []string
	// Compression is the job's gradient compression (jobspec.
	// CompressionScheme): applied to every all-reduce of a shared-memory
	// range, each range a bucket with its own state, over Ring (jobspec
	// refuses it in mode ps). The zero value compresses nothing.
	Compression compress.Scheme
}

// Server implements pb.AgentServer for one rank of one job.
type Server struct {
	pb.UnimplementedAgentServer
	cfg  Config
	coll Collective // cfg.Collective, or OverRing(cfg.Ring)

	// mu protects next, wake, failed, shm, buckets, inFlight, lastEnd
	// and lastCall.
	mu sync.Mutex
	// inFlight counts the collective calls under way (waiting for their
	// turn or running); lastEnd is when the last one ended (or when the
	// Server was made) and lastCall names it ("" before the first).
	inFlight int
	lastEnd  time.Time
	lastCall string
	// next is the sequence number of the collective whose turn it is.
	next int64
	// wake is closed (and replaced) whenever next advances or failed is
	// set.
	wake chan struct{}
	// failed is the first collective error: the ring is unusable after
	// it, so every later collective fails with it.
	failed error
	// shm is the shared-memory region of the registered layout, if the
	// script asked for one. Collectives use it only in their turn, and
	// RegisterLayout replaces it only in its own.
	shm *region
	// closed: Close was called; no region is made after it.
	closed bool
	// buckets are the compressed buckets of the registered layout (nil
	// before a layout is registered). Replaced by RegisterLayout in its
	// turn; used by AllReduce in its turn.
	buckets *bucketSet
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	coll := cfg.Collective
	switch {
	case coll == nil && cfg.Ring == nil:
		return nil, errors.New("agent: no ring and no collective")
	case coll == nil:
		coll = OverRing(cfg.Ring, cfg.Generation)
	case compressing(cfg.Compression) && cfg.Ring == nil:
		return nil, fmt.Errorf("agent: %s compression needs the job's ring (mode ring)", cfg.Compression.Type)
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, coll: coll, wake: make(chan struct{}), lastEnd: time.Now()}, nil
}

// Idle reports how long the script has made no collective call at now:
// the time since its last call ended (or since the Server was made), 0
// while a call is under way; last names that call, e.g. "all-reduce 41"
// ("" before the first). A script whose peers wait in a collective while
// its own agent is idle for about the step timeout is the one that
// hangs.
func (s *Server) Idle(now time.Time) (idle time.Duration, last string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight > 0 {
		return 0, s.lastCall
	}
	return now.Sub(s.lastEnd), s.lastCall
}

// Err returns the error that broke the server's ring, or nil.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Close releases the shared-memory region. Call it once the script has
// ended and no call is in flight (the socket has stopped serving).
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shm.close()
	s.shm, s.closed = nil, true
}

// Init implements pb.AgentServer.
func (s *Server) Init(context.Context, *pb.AgentInitRequest) (*pb.AgentInitResponse, error) {
	return &pb.AgentInitResponse{JobId: s.cfg.JobID, Generation: s.cfg.Generation, Rank: int32(s.coll.Rank()),
		WorldSize: int32(s.coll.Size()), StepTimeoutSeconds: s.cfg.StepTimeout.Seconds(), MaxElements: MaxElements,
		Compression: s.compressionType()}, nil
}

// compressionType names the job's compression for Init.
func (s *Server) compressionType() string {
	if !compressing(s.cfg.Compression) {
		return "none"
	}
	return s.cfg.Compression.Type
}

// RegisterLayout implements pb.AgentServer: it checks the layout and that
// every rank registered the same one (a layout call of the collective:
// its size and checksum).
func (s *Server) RegisterLayout(ctx context.Context, req *pb.RegisterLayoutRequest) (*pb.RegisterLayoutResponse, error) {
	n, sum, err := layoutSum(req.GetTensors())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	call := psstep.Call{Seq: req.GetSeq(), Kind: psstep.CallLayout, Lay: psstep.Layout{Elements: n, Checksum: sum}}
	err = s.collective(ctx, req.GetSeq(), "register_layout", func(ctx context.Context) error {
		if err := s.coll.Do(ctx, call, nil); err != nil {
			return err
		}
		// The new layout's buckets start empty, in this call's turn.
		bs := newBucketSet(req.GetTensors())
		s.mu.Lock()
		s.buckets = bs
		s.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	res := &pb.RegisterLayoutResponse{NumElements: n}
	if req.GetSharedMemory() {
		if n > maxShmElements {
			return nil, status.Errorf(codes.ResourceExhausted, "a shared region of %d values; at most %d", n, maxShmElements)
		}
		reg, err := newRegion(n)
		if err != nil {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			reg.close()
			return nil, status.Error(codes.Unavailable, "the agent is closing")
		}
		old := s.shm
		s.shm = reg
		s.mu.Unlock()
		old.close()
		res.ShmPath = reg.path
	}
	return res, nil
}

// maxShmElements bounds a shared region (16 GiB).
const maxShmElements = 1 << 32

// layoutSum checks a layout and returns its size and checksum.
func layoutSum(ts []*pb.TensorInfo) (n int64, sum uint32, err error) {
	if len(ts) == 0 || len(ts) > maxTensors {
		return 0, 0, fmt.Errorf("a layout has 1..%d tensors; got %d", maxTensors, len(ts))
	}
	h := crc32.NewIEEE()
	for i, t := range ts {
		if t.GetName() == "" || len(t.GetName()) > 1024 {
			return 0, 0, fmt.Errorf("tensor %d: name must be 1..1024 bytes", i)
		}
		if t.GetDtype() != "float32" {
			return 0, 0, fmt.Errorf("tensor %q: dtype %q; allowed: float32", t.GetName(), t.GetDtype())
		}
		size := int64(1)
		for _, d := range t.GetShape() {
			if d < 0 || d > 1<<40 || size > (1<<40)/max(d, 1) {
				return 0, 0, fmt.Errorf("tensor %q: shape %v out of range", t.GetName(), t.GetShape())
			}
			size *= d
		}
		n += size
		if n > 1<<40 {
			return 0, 0, errors.New("layout too large")
		}
		fmt.Fprintf(h, "%s|%v|%s;", t.GetName(), t.GetShape(), t.GetDtype())
	}
	return n, h.Sum32(), nil
}

// AllReduce implements pb.AgentServer: on the request's data, or in place
// on a range of the shared region.
func (s *Server) AllReduce(ctx context.Context, req *pb.AllReduceRequest) (*pb.AllReduceResponse, error) {
	rng := req.GetShm()
	if rng != nil && len(req.GetData()) > 0 {
		return nil, status.Error(codes.InvalidArgument, "give data or a shared-memory range, not both")
	}
	compressed := rng != nil && compressing(s.cfg.Compression)
	if compressed && !req.GetAverage() {
		return nil, status.Errorf(codes.InvalidArgument, "the job compresses gradients (%s): an all-reduce of a shared-memory range averages; set average", s.cfg.Compression.Type)
	}
	var buf []float32
	if rng == nil {
		var err error
		if buf, err = decode(req.GetData()); err != nil {
			return nil, err
		}
	}
	err := s.collective(ctx, req.GetSeq(), "all_reduce", func(ctx context.Context) error {
		if rng != nil {
			// The range is checked in the call's turn (the region may
			// be replaced by an earlier RegisterLayout); a bad one
			// breaks the agent, as the ranks no longer agree.
			s.mu.Lock()
			reg := s.shm
			s.mu.Unlock()
			if reg == nil {
				return status.Error(codes.FailedPrecondition, "no shared memory: register the layout with shared_memory first")
			}
			var err error
			if buf, err = reg.slice(rng.GetOffset(), rng.GetLength()); err != nil {
				return status.Error(codes.InvalidArgument, err.Error())
			}
			reg.unlinked() // the script has mapped it: nothing to leave behind
		}
		if compressed {
			return s.reduceBucket(ctx, rng.GetOffset(), buf)
		}
		return s.coll.Do(ctx, psstep.Call{Seq: req.GetSeq(), Kind: psstep.CallSum, Len: len(buf)}, buf)
	})
	if err != nil {
		return nil, err
	}
	if req.GetAverage() && !compressed {
		average(buf, s.coll.Size())
	}
	if rng != nil {
		return &pb.AllReduceResponse{}, nil
	}
	return &pb.AllReduceResponse{Data: encode(buf)}, nil
}

// average divides buf by n in place. For a power of two n it multiplies
// by 1/n, which is exact, so the result is the division's bit for bit at
// a fraction of its cost (the worker shares the cores with the script).
func average(buf []float32, n int) {
	if n&(n-1) == 0 {
		inv := 1 / float32(n)
		for i := range buf {
			buf[i] *= inv
		}
		return
	}
	d := float32(n)
	for i := range buf {
		buf[i] /= d
	}
}

// Broadcast implements pb.AgentServer.
func (s *Server) Broadcast(ctx context.Context, req *pb.BroadcastRequest) (*pb.BroadcastResponse, error) {
	if r := req.GetRoot(); r < 0 || int(r) >= s.coll.Size() {
		return nil, status.Errorf(codes.InvalidArgument, "root %d out of range; allowed 0..%d", r, s.coll.Size()-1)
	}
	buf, err := decode(req.GetData())
	if err != nil {
		return nil, err
	}
	err = s.collective(ctx, req.GetSeq(), "broadcast", func(ctx context.Context) error {
		return s.coll.Do(ctx, psstep.Call{Seq: req.GetSeq(), Kind: psstep.CallBroadcast, Len: len(buf), Root: int(req.GetRoot())}, buf)
	})
	if err != nil {
		return nil, err
	}
	return &pb.BroadcastResponse{Data: encode(buf)}, nil
}

// Barrier implements pb.AgentServer.
func (s *Server) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierResponse, error) {
	err := s.collective(ctx, req.GetSeq(), "barrier", func(ctx context.Context) error {
		return s.coll.Do(ctx, psstep.Call{Seq: req.GetSeq(), Kind: psstep.CallBarrier}, nil)
	})
	if err != nil {
		return nil, err
	}
	return &pb.BarrierResponse{}, nil
}

// Report implements pb.AgentServer.
func (s *Server) Report(_ context.Context, req *pb.ReportRequest) (*pb.ReportResponse, error) {
	for name, v := range map[string]float64{"loss": req.GetLoss(), "images_per_second": req.GetImagesPerSecond(),
		"learning_rate": req.GetLearningRate(), "test_loss": req.GetTestLoss(), "train_loss": req.GetTrainLoss()} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, status.Errorf(codes.InvalidArgument, "%s is %v; want a finite number", name, v)
		}
	}
	if a := req.GetTestAccuracy(); !(a >= 0 && a <= 1) {
		return nil, status.Errorf(codes.InvalidArgument, "test_accuracy %v out of range; allowed [0, 1]", a)
	}
	if req.GetStep() < 0 || req.GetTotalSteps() < 0 || req.GetEpoch() < 0 {
		return nil, status.Error(codes.InvalidArgument, "epoch, step and total_steps must not be negative")
	}
	if s.cfg.Report != nil {
		s.cfg.Report(req)
	}
	return &pb.ReportResponse{}, nil
}

func (s *Server) opt() aggregator.Options {
	return aggregator.Options{Generation: s.cfg.Generation}
}

// collective runs fn as collective number seq: after every lower number
// has run, within the step timeout. An error of fn breaks the server (the
// ring is unusable after a failed collective).
func (s *Server) collective(ctx context.Context, seq int64, what string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StepTimeout)
	defer cancel()
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.lastEnd, s.lastCall = time.Now(), fmt.Sprintf("%s %d", what, seq)
		s.mu.Unlock()
	}()
	if err := s.waitTurn(ctx, seq, what); err != nil {
		return err
	}
	recv0, counted := s.received()
	err := fn(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		recv1, _ := s.received()
		st := s.explain(ctx, seq, what, err, counted && recv1 == recv0)
		s.failed = st.Err()
		s.cfg.Logger.Warn("agent collective failed", "job", s.cfg.JobID, "rank", s.coll.Rank(), "seq", seq, "op", what, "err", err)
	} else {
		s.next++
	}
	close(s.wake)
	s.wake = make(chan struct{})
	if s.failed != nil {
		return s.failed
	}
	return nil
}

// waitTurn waits until collective seq may run.
func (s *Server) waitTurn(ctx context.Context, seq int64, what string) error {
	for {
		s.mu.Lock()
		next, failed, wake := s.next, s.failed, s.wake
		s.mu.Unlock()
		switch {
		case failed != nil:
			return failed
		case seq < next:
			return status.Errorf(codes.FailedPrecondition, "%s: sequence number %d was used already (the next is %d): number collectives 0, 1, 2, … once each", what, seq, next)
		case seq == next:
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return status.Errorf(codes.DeadlineExceeded, "%s %d: waited %v for collective %d, which never came (every number must be called once, in a script's own order)", what, seq, s.cfg.StepTimeout, next)
		}
	}
}

// trafficker is a ring that counts the bytes it takes from its left
// neighbour (ringrpc's does).
type trafficker interface {
	Traffic() (sent, received int64, right, left string)
}

// received is what the ring has taken from the left neighbour so far, if
// it counts it.
func (s *Server) received() (int64, bool) {
	if s.cfg.Collective != nil {
		return 0, false // not the ring's
	}
	t, ok := s.cfg.Ring.(trafficker)
	if !ok {
		return 0, false
	}
	_, recv, _, _ := t.Traffic()
	return recv, true
}

// explain maps a failed collective to a status naming the call. silent:
// the left neighbour sent nothing of this collective (as far as the ring
// counts), so at a timeout it is the rank that never joined: its script
// made no such call within the step timeout (it hangs, or computes far
// slower), while this rank's did. (The ring's other ranks got frames
// from their left neighbours, which had joined; only the right
// neighbour of a rank that never joined sees nothing at all.)
func (s *Server) explain(ctx context.Context, seq int64, what string, err error, silent bool) *status.Status {
	var pe *aggregator.PeerError
	if st, ok := status.FromError(err); ok {
		return st // the agent's own refusal
	}
	switch {
	case errors.As(err, &pe):
		return status.Newf(codes.Unavailable, "%s %d: peer rank %d is gone: %v", what, seq, pe.Rank, err)
	case errors.Is(err, aggregator.ErrUnexpectedFrame):
		return status.Newf(codes.FailedPrecondition, "%s %d: the ranks disagree about this call (another kind, length or root at the same number): %v", what, seq, err)
	case errors.Is(ctx.Err(), context.Canceled):
		return status.Newf(codes.Canceled, "%s %d: the script's call was cancelled (it exited or dropped its connection) before the collective completed: %v", what, seq, err)
	case ctx.Err() != nil && silent:
		left := (s.cfg.Ring.Rank() + s.cfg.Ring.Size() - 1) % s.cfg.Ring.Size()
		at := ""
		if left < len(s.cfg.Peers) {
			at = " (" + s.cfg.Peers[left] + ")"
		}
		return status.Newf(codes.DeadlineExceeded, "%s %d: rank %d%s never joined it within the step timeout of %v: its script made no such call (hung, or far slower than rank %d's): %v",
			what, seq, left, at, s.cfg.StepTimeout, s.cfg.Ring.Rank(), err)
	case ctx.Err() != nil:
		return status.Newf(codes.DeadlineExceeded, "%s %d did not complete within the step timeout of %v: %v", what, seq, s.cfg.StepTimeout, err)
	}
	return status.Newf(codes.Internal, "%s %d: %v", what, seq, err)
}

// decode reads little-endian float32 values.
func decode(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "data is %d bytes, not a whole number of float32 values", len(b))
	}
	n := len(b) / 4
	if n > MaxElements {
		return nil, status.Errorf(codes.ResourceExhausted, "data holds %d values; at most %d a call (split it into buckets)", n, MaxElements)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// encode writes little-endian float32 values.
func encode(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
