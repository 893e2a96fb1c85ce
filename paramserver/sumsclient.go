package paramserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ScriptClient is one rank's Reduce streams to its entrypoint job's
// summation shards (Sums): the parameter server's side of the agent's
// collectives (agent.Collective) in mode ps. Each call goes to every
// shard with the shard's piece of its values (psstep.Call.Piece), the
// shards in parallel; the calls go one at a time, in the order the agent
// runs them. Not safe for concurrent Do calls (the agent runs one at a
// time).
type ScriptClient struct {
	cfg   ScriptConfig
	links []*scriptLink
	// cancel ends every stream: after a failed call (the streams are
	// then out of step with the shards) or at Abort.
	cancel context.CancelFunc
}

// ScriptConfig configures a ScriptClient.
type ScriptConfig struct {
	JobID      string
	Generation uint64
	Rank       int
	World      int
	// Shards is the job's parameter_server.shards (0 counts as 1).
	Shards int
	// Spec is the job's spec, sent with the joins for `gradsync
	// aggregator` shards (nil for the coordinator's).
	Spec *pb.JobSpec
	// Where names the shards' hosts in errors: one name for all (e.g.
	// "the coordinator"), or one per shard (e.g. "aggregator
	// 10.0.0.7:7071").
	Where []string
}

// scriptLink is one shard's stream.
type scriptLink struct {
	index  int
	stream pb.ParameterServer_ReduceClient
	sp     wire.Splitter
}

// verdictGrace is how much longer than its call's context a rank waits
// for a shard's answer when the context's deadline passes: the shard
// times out the call too (it started waiting a little later) and names
// the ranks that never made it, which this rank cannot know.
const verdictGrace = 2 * time.Second

// DialScript opens rank cfg.Rank's stream to every shard and joins: over
// conns[0] for every shard (the coordinator's), or over conns[i] for
// shard i (aggregators'), without waiting: the shards answer nothing until the first call,
// which fails if a join was refused (each call is bounded by its
// context). The streams live until Close or Abort, not with ctx.
func DialScript(ctx context.Context, conns []grpc.ClientConnInterface, cfg ScriptConfig) (*ScriptClient, error) {
	cfg.Shards = max(cfg.Shards, 1)
	if len(conns) != 1 && len(conns) != cfg.Shards {
		return nil, fmt.Errorf("%d connections for %d parameter-server shards", len(conns), cfg.Shards)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &ScriptClient{cfg: cfg, cancel: cancel}
	for i := range cfg.Shards {
		l := &scriptLink{index: i}
		var err error
		if l.stream, err = pb.NewParameterServerClient(conns[min(i, len(conns)-1)]).Reduce(sctx); err != nil {
			c.Abort()
			return nil, c.explain(l, err)
		}
		c.links = append(c.links, l)
		join := &pb.ReduceJoin{JobId: cfg.JobID, Generation: cfg.Generation, Rank: int32(cfg.Rank), WorldSize: int32(cfg.World),
			Shard: int32(i), NumShards: int32(cfg.Shards), Spec: cfg.Spec}
		if err := l.stream.Send(&pb.ReduceRequest{Msg: &pb.ReduceRequest_Join{Join: join}}); err != nil {
			c.Abort()
			return nil, c.explain(l, c.recvErr(l, err))
		}
	}
	return c, nil
}

// Rank is this rank.
func (c *ScriptClient) Rank() int { return c.cfg.Rank }

// Size is the number of ranks.
func (c *ScriptClient) Size() int { return c.cfg.World }

// Do runs call over the shards: buf (call.Len values) is this rank's
// values and receives the result (a sum, or the root's values). The
// error is a status naming the shard, and the ranks at fault where the
// shard knows them. After an error the client is unusable.
func (c *ScriptClient) Do(ctx context.Context, call psstep.Call, buf []float32) error {
	if call.Kind == psstep.CallSum || call.Kind == psstep.CallBroadcast {
		call.Len = len(buf)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	// A Recv takes no context: when ctx is cancelled, or its deadline
	// and then the grace for the shard's verdict pass, every stream is
	// ended, which ends the Recvs.
	wctx, cancel := graceContext(ctx, verdictGrace)
	defer cancel()
	stop := context.AfterFunc(wctx, c.cancel)
	defer stop()
	run := func(l *scriptLink) error {
		piece, rng := call.Piece(l.index, len(c.links))
		err := c.doLink(l, piece, buf[rng.Lo:rng.Hi])
		if err != nil && wctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return status.Errorf(codes.DeadlineExceeded, "%v: %s gave no answer within the step timeout and %v more", call, c.who(l), verdictGrace)
			}
			return status.Errorf(codes.Canceled, "%v: the call was cancelled before %s answered: %v", call, c.who(l), context.Cause(ctx))
		}
		if err != nil {
			return c.explain(l, err)
		}
		return nil
	}
	if len(c.links) == 1 {
		err := run(c.links[0])
		if err != nil {
			c.cancel()
		}
		return err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards first
		first error
	)
	for _, l := range c.links {
		wg.Add(1)
		go func() { // owned by Do: one shard's piece of the call
			defer wg.Done()
			if err := run(l); err != nil {
				mu.Lock()
				if first == nil {
					// The cause, kept before the other links' streams
					// end (they then fail as cancelled, not waiting on
					// shards that will not answer).
					first = err
					c.cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// graceContext is ctx whose deadline, if it has one, is grace later;
// its cancellation still ends it at once.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	var wctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		wctx, cancel = context.WithDeadline(base, dl.Add(grace))
	} else {
		wctx, cancel = context.WithCancel(base)
	}
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return wctx, func() { stop(); cancel() }
}

// doLink sends piece (this shard's part of the call, values vals) and
// receives its answer into vals.
func (c *ScriptClient) doLink(l *scriptLink, piece psstep.Call, vals []float32) error {
	h := &pb.ReduceCall{Seq: piece.Seq, Kind: pb.CallKind(piece.Kind), Length: int64(piece.Len), Root: int32(piece.Root),
		LayoutElements: piece.Lay.Elements, LayoutChecksum: piece.Lay.Checksum}
	if err := l.stream.Send(&pb.ReduceRequest{Msg: &pb.ReduceRequest_Call{Call: h}}); err != nil {
		return c.recvErr(l, err)
	}
	op := pb.Op_OP_ALL_REDUCE
	if piece.Kind == psstep.CallBroadcast {
		op = pb.Op_OP_BROADCAST
	}
	tag := &pb.TensorFrame{JobId: c.cfg.JobID, Generation: c.cfg.Generation, Op: op, Step: piece.Seq, Rank: int32(c.cfg.Rank)}
	if piece.Sends(c.cfg.Rank) {
		err := l.sp.Frames(tag, vals, func(f *pb.TensorFrame) error {
			return l.stream.Send(&pb.ReduceRequest{Msg: &pb.ReduceRequest_Data{Data: f}})
		})
		if err != nil {
			return c.recvErr(l, err)
		}
	}
	if !piece.Answered() {
		m, err := l.stream.Recv()
		if err != nil {
			return err
		}
		if m.Seq != piece.Seq || m.Result != nil {
			return status.Errorf(codes.Internal, "answer to call %d, want an empty answer to %v", m.Seq, piece)
		}
		return nil
	}
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: c.cfg.JobID, Generation: c.cfg.Generation, Op: op, Step: piece.Seq, Total: uint64(piece.Len)}, 0)
	for !asm.Done() {
		m, err := l.stream.Recv()
		if err != nil {
			return err
		}
		if err := asm.Copy(vals, m.Result); err != nil {
			return status.Errorf(codes.Internal, "the answer to %v: %v", piece, err)
		}
	}
	return nil
}

// recvErr turns a Send error into the stream's real status: gRPC reports
// io.EOF on Send when the server ended the stream, and the reason comes
// from Recv.
func (c *ScriptClient) recvErr(l *scriptLink, err error) error {
	if _, rerr := l.stream.Recv(); rerr != nil {
		return rerr
	}
	return err
}

// who names a link's shard.
func (c *ScriptClient) who(l *scriptLink) string {
	w := fmt.Sprintf("parameter-server shard %d of %d", l.index, c.cfg.Shards)
	if n := len(c.cfg.Where); n > 0 {
		w += " on " + c.cfg.Where[min(l.index, n-1)]
	}
	return w
}

// explain keeps err's status code and says which shard it came from
// (the shard's own messages name it already).
func (c *ScriptClient) explain(l *scriptLink, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unavailable, "%s: %v", c.who(l), err)
	}
	code := st.Code()
	if code == codes.Canceled || code == codes.Unknown {
		code = codes.Unavailable // the shard's stream ended under us
	}
	return status.Errorf(code, "%s: %s", c.who(l), st.Message())
}

// Close ends the rank's streams after its script is done, in good order:
// it closes its side of each and waits (within ctx) for the shard to end
// the stream, so that the shards see the rank leave, not break off.
func (c *ScriptClient) Close(ctx context.Context) {
	stop := context.AfterFunc(ctx, c.cancel)
	defer stop()
	for _, l := range c.links {
		if l.stream.CloseSend() == nil {
			for {
				if _, err := l.stream.Recv(); err != nil {
					break
				}
			}
		}
	}
	c.cancel()
}

// Abort ends the rank's streams at once (its script failed): the shards
// fail the calls the other ranks wait in, naming this rank.
func (c *ScriptClient) Abort() { c.cancel() }
