package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Sums is the parameter server of an entrypoint job in mode ps, which
// the coordinator hosts: parameter_server.shards summation shards (as
// BytePS's servers) for its script's collective calls (ps.proto's
// Reduce). The script keeps its own parameters and optimiser, so the
// shards hold no model: each call's values are summed (or a broadcast's
// root's handed on) and answered to every rank; the largest call a shard
// takes follows the gradient layout the ranks registered (psstep.Calls).
type Sums struct {
	shards []*sumShard
}

// MaxCallElements is the most values a call of a script carries before
// its ranks register a layout, and in any message (the agent's bound).
const MaxCallElements = 1 << 20

// sumShard is one summation shard of one job's generation.
type sumShard struct {
	jobID            string
	gen              uint64
	world            int
	index, numShards int
	stepTimeout      time.Duration
	env              Env

	mu     sync.Mutex    // guards core, done, joined, left
	core   *psstep.Calls // the calls' arithmetic
	done   chan struct{} // closed when the current call completes
	joined []bool
	left   []bool // ranks whose stream has ended

	abortOnce sync.Once
	aborted   chan struct{} // closed by abort
	abortErr  error         // a status error, set before aborted is closed
}

// NewSums builds the summation shards of generation gen of an entrypoint
// job of world ranks, with shards shards and the spec's step timeout.
func NewSums(env Env, jobID string, gen uint64, world, shards int, stepTimeout time.Duration) *Sums {
	g := &Sums{shards: make([]*sumShard, max(shards, 1))}
	for i := range g.shards {
		g.shards[i] = newSumShard(env, jobID, gen, world, i, len(g.shards), stepTimeout)
	}
	return g
}

// newSumShard builds shard index of numShards (NewSums; a `gradsync
// aggregator` process hosts one).
func newSumShard(env Env, jobID string, gen uint64, world, index, numShards int, stepTimeout time.Duration) *sumShard {
	return &sumShard{jobID: jobID, gen: gen, world: world, index: index, numShards: numShards, stepTimeout: stepTimeout, env: env,
		core: psstep.NewCalls(world, MaxCallElements), done: make(chan struct{}), joined: make([]bool, world), left: make([]bool, world),
		aborted: make(chan struct{})}
}

// anyJoined reports whether a rank has joined the shard.
func (p *sumShard) anyJoined() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.joined, true)
}

// Abort stops every shard: every stream waiting on one returns err's
// status (Aborted unless err is a status error).
func (g *Sums) Abort(err error) {
	for _, p := range g.shards {
		p.abort(err)
	}
}

// RecvReduceJoin reads the join that opens a Reduce stream.
func RecvReduceJoin(stream pb.ParameterServer_ReduceServer) (*pb.ReduceJoin, error) {
	_, join, err := rpc.First(stream.Recv, (*pb.ReduceRequest).GetJoin, "Reduce", "join")
	return join, err
}

// Serve serves one rank's Reduce stream, opened by join, to the shard the
// join names, until the rank closes it or the job stops.
func (g *Sums) Serve(stream pb.ParameterServer_ReduceServer, join *pb.ReduceJoin) error {
	if join.Shard < 0 || int(join.Shard) >= len(g.shards) || int(max(join.NumShards, 1)) != len(g.shards) {
		return status.Errorf(codes.InvalidArgument, "joined shard %d of %d; the job has %d parameter-server shard(s)", join.Shard, max(join.NumShards, 1), len(g.shards))
	}
	return g.shards[join.Shard].serve(stream, join)
}

func (p *sumShard) abort(err error) {
	p.abortOnce.Do(func() {
		if _, ok := status.FromError(err); !ok {
			err = status.Errorf(codes.Aborted, "job aborted: %v", err)
		}
		p.abortErr = err
		close(p.aborted)
	})
}

// who names the shard in messages.
func (p *sumShard) who() string {
	return fmt.Sprintf("parameter-server shard %d of %d", p.index, p.numShards)
}

// serve checks rank's join and serves its calls: each call's header and
// values in, the wait for the other ranks', the result out.
func (p *sumShard) serve(stream pb.ParameterServer_ReduceServer, join *pb.ReduceJoin) error {
	switch {
	case join.Generation != p.gen:
		return status.Errorf(codes.Aborted, "generation %d is stale; the job is at generation %d", join.Generation, p.gen)
	case join.Rank < 0 || int(join.Rank) >= p.world:
		return status.Errorf(codes.InvalidArgument, "rank %d out of range [0,%d)", join.Rank, p.world)
	case int(join.WorldSize) != p.world:
		return status.Errorf(codes.InvalidArgument, "world size %d, the job has %d", join.WorldSize, p.world)
	}
	rank := int(join.Rank)
	p.mu.Lock()
	if p.joined[rank] {
		p.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "rank %d of job %s has already joined %s", rank, p.jobID, p.who())
	}
	p.joined[rank] = true
	p.mu.Unlock()
	ctx := stream.Context()
	err := p.serveCalls(ctx, stream, rank)
	p.mu.Lock()
	p.left[rank] = true
	p.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		// The rank's stream ended under it (its worker stopped, or its
		// connection broke): the others must not wait the step timeout
		// for it.
		p.abort(status.Errorf(codes.Unavailable, "rank %d left in the middle of its script's calls (its worker stopped it, or its connection broke): %v", rank, context.Cause(ctx)))
	}
	return err
}

func (p *sumShard) serveCalls(ctx context.Context, stream pb.ParameterServer_ReduceServer, rank int) error {
	timer := time.NewTimer(p.stepTimeout)
	defer timer.Stop()
	var sp wire.Splitter
	for {
		m, err := p.recv(ctx, stream)
		if errors.Is(err, io.EOF) {
			return nil // the rank's script is done
		}
		if err != nil {
			return err
		}
		h := m.GetCall()
		if h == nil {
			return status.Errorf(codes.InvalidArgument, "rank %d: expected a call", rank)
		}
		call := psstep.Call{Seq: h.Seq, Kind: psstep.CallKind(h.Kind), Len: int(h.Length), Root: int(h.Root),
			Lay: psstep.Layout{Elements: h.LayoutElements, Checksum: h.LayoutChecksum}}
		if h.Length < 0 || h.Length > 1<<40 {
			return status.Errorf(codes.InvalidArgument, "rank %d: call %d of %d values", rank, h.Seq, h.Length)
		}
		p.mu.Lock()
		done := p.done
		completed, err := p.core.Begin(rank, call)
		p.completedLocked(completed)
		p.mu.Unlock()
		if err != nil {
			return p.callErr(rank, err)
		}
		if call.Sends(rank) {
			if err := p.recvValues(ctx, stream, rank, call); err != nil {
				return err
			}
		}
		if err := p.wait(ctx, timer, call, done); err != nil {
			return err
		}
		p.mu.Lock()
		res := p.core.Result() // valid until this rank makes its next call
		p.mu.Unlock()
		if !call.Answered() {
			err = stream.Send(&pb.ReduceResponse{Seq: call.Seq})
		} else {
			err = sp.Frames(p.tag(call), res, func(f *pb.TensorFrame) error {
				return stream.Send(&pb.ReduceResponse{Seq: call.Seq, Result: f})
			})
		}
		if err != nil {
			return err
		}
	}
}

// recv reads the rank's next message; a Recv ends with ctx, the stream's.
func (p *sumShard) recv(ctx context.Context, stream pb.ParameterServer_ReduceServer) (*pb.ReduceRequest, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	select {
	case <-p.aborted:
		return nil, p.abortErr
	default:
	}
	return stream.Recv()
}

// tag is the frames' tags of call's values and result.
func (p *sumShard) tag(call psstep.Call) *pb.TensorFrame {
	op := pb.Op_OP_ALL_REDUCE
	if call.Kind == psstep.CallBroadcast {
		op = pb.Op_OP_BROADCAST
	}
	return &pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: op, Step: call.Seq}
}

// recvValues takes rank's values of call into the shard.
func (p *sumShard) recvValues(ctx context.Context, stream pb.ParameterServer_ReduceServer, rank int, call psstep.Call) error {
	tag := p.tag(call)
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: tag.Op, Step: call.Seq, Total: uint64(call.Len)}, 0)
	for !asm.Done() {
		m, err := p.recv(ctx, stream)
		if errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "rank %d closed its stream in the middle of %v", rank, call)
		}
		if err != nil {
			return err
		}
		f := m.GetData()
		off, n, err := asm.Take(f, len(f.GetData()), len(f.GetScales()))
		if err != nil {
			return frameErr(rank, err)
		}
		p.mu.Lock()
		completed, err := p.core.Add(rank, off, n, func(dst []float32, add bool) error {
			if add {
				return wire.AddF32(dst, f.Data)
			}
			return wire.GetF32(dst, f.Data)
		})
		p.completedLocked(completed)
		p.mu.Unlock()
		if err != nil {
			return p.callErr(rank, err)
		}
	}
	return nil
}

// completedLocked wakes the streams waiting on the call that completed.
func (p *sumShard) completedLocked(completed bool) {
	if completed {
		close(p.done)
		p.done = make(chan struct{})
	}
}

// callErr is the status of the core's refusal of rank's call; ranks that
// disagree about a call fail every rank's (FailedPrecondition).
func (p *sumShard) callErr(rank int, err error) error {
	var de *psstep.DisagreeError
	if errors.As(err, &de) {
		st := status.Error(codes.FailedPrecondition, err.Error())
		p.abort(st)
		return st
	}
	return status.Errorf(codes.InvalidArgument, "rank %d: %v", rank, err)
}

// wait waits for done (every rank's part of call in), within the step
// timeout; at the timeout it names the ranks that never made the call and
// fails every rank's.
func (p *sumShard) wait(ctx context.Context, timer *time.Timer, call psstep.Call, done chan struct{}) error {
	timer.Reset(p.stepTimeout)
	select {
	case <-done:
		return nil
	case <-p.aborted:
		return p.abortErr
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-timer.C:
	}
	p.mu.Lock()
	var missing, gone []int
	if p.core.Seq() == call.Seq {
		missing = p.core.Missing()
		for _, r := range missing {
			if p.left[r] || !p.joined[r] {
				gone = append(gone, r)
			}
		}
	}
	p.mu.Unlock()
	why := "their scripts made no such call (hung, or far slower)"
	if len(gone) > 0 {
		why = fmt.Sprintf("rank(s) %v had closed their streams or never joined (their scripts ended or never started)", gone)
	}
	st := status.Errorf(codes.DeadlineExceeded, "%v: rank(s) %v never joined it within the step timeout of %v: %s", call, missing, p.stepTimeout, why)
	p.abort(st)
	return st
}
