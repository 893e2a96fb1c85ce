package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// psClient is this rank's push/pull streams to the job's parameter-server
// shards: one link per shard, each carrying the shard's range of the
// flat parameters (aggregator.Partition), all driven in parallel each
// step.
type psClient struct {
	a        *pb.Assignment
	links    []*psLink
	conns    []*grpc.ClientConn // to `gradsync aggregator` processes; closed by close
	cancel   context.CancelFunc // ends every link's stream
	timeout  time.Duration
	timedOut atomic.Bool
	applied  int64 // updates applied to the parameters we hold
	metrics  *metrics.Registry
	stats    psStats
}

// psLink is one shard's Sync stream.
type psLink struct {
	c       *psClient
	index   int
	addr    string // the aggregator's address; "" for the coordinator's own shards
	rng     aggregator.Range
	stream  pb.ParameterServer_SyncClient // uses framecodec's codec
	in      framecodec.SyncResponse       // the message last received; reused
	out     framecodec.Sender             // sends float32 frames without copying them
	sp      wire.Splitter
	push    *compress.PSPusher // encodes the pushes and keeps the rank's compression state
	side    *psstep.Rank       // the rank's side of each step's arithmetic, over push (pscompress.go)
	receipt *pb.PushReceipt    // async/bounded: the receipt of the last answer
}

// psStats are the staleness figures of a rank's async and bounded
// shards (psstep.Staleness sums their receipts).
type psStats struct{ psstep.Staleness }

// joinPS opens one Sync stream per shard (to the coordinator, or to the
// aggregators the assignment names), joins, and receives the initial
// parameters (those after start.step steps) into params.
func joinPS(ctx context.Context, env *taskEnv, a *pb.Assignment, net *models.Network, totalSteps int64, start psStart) (*psClient, error) {
	k := int(max(a.Spec.GetParameterServer().GetShards(), 1))
	addrs := a.PsAddresses
	if len(addrs) != 0 && len(addrs) != k {
		return nil, fmt.Errorf("%d parameter-server addresses for %d shards", len(addrs), k)
	}
	params := net.Params()
	if len(params) < k {
		return nil, fmt.Errorf("%d parameter-server shards for %d parameters", k, len(params))
	}
	sctx, cancel := context.WithCancel(ctx)
	c := &psClient{a: a, cancel: cancel, metrics: env.metrics, timeout: time.Duration(a.Spec.GetStepTimeoutSeconds() * float64(time.Second))}
	jctx, done := c.stepContext(ctx)
	defer done()
	for i, rng := range aggregator.Partition(len(params), k) {
		segs := net.Segments()
		if k > 1 {
			// No compression with shards (jobspec): the pusher only
			// needs the range's length.
			segs = []models.Segment{{Name: fmt.Sprintf("shard%d", i), Shape: []int{rng.Len()}, Len: rng.Len()}}
		}
		sc, err := jobspec.CompressionScheme(a.Spec.GetCompression(), a.Spec.GetSeed())
		if err != nil {
			c.close()
			return nil, err
		}
		push, err := compress.NewPSPusher(sc, segs, int(a.Rank))
		if err != nil {
			c.close()
			return nil, err
		}
		l := &psLink{c: c, index: i, rng: rng, push: push, side: psstep.NewRank(push)}
		c.links = append(c.links, l)
		conn := env.conn
		join := &pb.SyncJoin{JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, WorldSize: a.WorldSize, NumParams: int64(len(params)),
			TotalSteps: totalSteps, TrainExamples: int64(start.trainExamples), Shard: int32(i), NumShards: int32(k)}
		if len(addrs) > 0 {
			l.addr = addrs[i]
			if conn, err = grpc.NewClient(l.addr, env.psDial...); err != nil {
				c.close()
				return nil, l.explain(err)
			}
			c.conns = append(c.conns, conn)
			join.Spec = a.Spec // the aggregator learns the job from it
		}
		// framecodec's codec: gradients go out without copies, and
		// parameters are read straight from gRPC's receive buffers.
		if l.stream, err = pb.NewParameterServerClient(conn).Sync(sctx, framecodec.CallOption()); err != nil {
			c.close()
			return nil, l.explain(err)
		}
		if err := l.stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: join}}); err != nil {
			c.close()
			return nil, l.explain(l.recvErr(err))
		}
	}
	err := c.parallel(func(l *psLink) error {
		_, err := l.recvParams(jctx, params[l.rng.Lo:l.rng.Hi], start.step)
		return err
	})
	if err != nil {
		c.close()
		return nil, err
	}
	c.applied = start.step
	return c, nil
}

// parallel runs fn on every link, concurrently when there are several,
// and returns the first error; the first failure ends every link's
// stream, so no link waits on a shard that will not answer.
func (c *psClient) parallel(fn func(*psLink) error) error {
	if len(c.links) == 1 {
		return fn(c.links[0])
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards first
		first error
	)
	for _, l := range c.links {
		wg.Add(1)
		go func() { // owned by parallel: one shard's push and pull
			defer wg.Done()
			if err := fn(l); err != nil {
				mu.Lock()
				if first == nil {
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

// errStepTimeout is the cause of a step context that ran out of time.
var errStepTimeout = errors.New("parameter server: step timeout")

// stepContext bounds one step (or the join) by ctx and the job's step
// timeout: when either ends, every link's stream is ended, since that is
// what unblocks a stream's Recv; explain then says whether the timeout
// ended it. done releases the context's resources.
func (c *psClient) stepContext(ctx context.Context) (_ context.Context, done func()) {
	sctx, cancel := context.WithTimeoutCause(ctx, c.timeout, errStepTimeout)
	stop := context.AfterFunc(sctx, func() {
		if errors.Is(context.Cause(sctx), errStepTimeout) {
			c.timedOut.Store(true)
		}
		c.cancel()
	})
	return sctx, func() { stop(); cancel() }
}

// step pushes grads for the current step to every shard in parallel and
// overwrites params with the parameters they answer, within ctx and the
// step timeout (see psLink.step). When ctx ends mid step, every link's
// stream is ended (stepContext), so the client is done; under a ctx that
// has already ended, step sends nothing and returns ctx's error.
func (c *psClient) step(ctx context.Context, grads, params []float32) error {
	if err := ctx.Err(); err != nil {
		return err // nothing sent: the streams stay as they are
	}
	ctx, done := c.stepContext(ctx)
	defer done()
	step := c.applied
	err := c.parallel(func(l *psLink) error {
		return l.step(ctx, step, grads[l.rng.Lo:l.rng.Hi], params[l.rng.Lo:l.rng.Hi])
	})
	if err != nil {
		return err
	}
	c.applied = step + 1
	c.noteReceipts()
	// One observation of every shard's pushes together: the registry
	// turns successive totals into counter increments.
	st := c.compressStats()
	c.metrics.ObserveCompression(c.a.JobId, metrics.CompressionTotals{RawBytes: st.RawBytes, SentBytes: st.SentBytes, Seconds: st.CompressSeconds})
	return nil
}

// noteReceipts adds the step's receipts (async and bounded shards) to the
// rank's staleness figures.
func (c *psClient) noteReceipts() {
	var rcs []psstep.Receipt
	for _, l := range c.links {
		if rc := l.receipt; rc != nil {
			rcs = append(rcs, psstep.Receipt{Refused: rc.Refused, StaleSteps: rc.StaleSteps, StaleUpdates: rc.StaleUpdates, WaitSeconds: rc.WaitSeconds})
			l.receipt = nil
		}
	}
	c.stats.Note(rcs)
}

// fill copies the figures into a progress report and a result (either
// may be nil); nothing when no shard sent a receipt (consistency sync).
func (st psStats) fill(p *pb.Progress, r *pb.JobResult) {
	steps, updates, ok := st.Means()
	if !ok {
		return
	}
	if p != nil {
		p.PsStaleStepsMean, p.PsStaleStepsMax = steps, st.MaxSteps
		p.PsStaleUpdatesMean, p.PsStaleUpdatesMax = updates, st.MaxUpdates
		p.PsWaitSeconds, p.PsRefused = st.WaitSeconds, st.Refused
	}
	if r != nil {
		r.PsStaleStepsMean, r.PsStaleStepsMax = steps, st.MaxSteps
		r.PsStaleUpdatesMean, r.PsStaleUpdatesMax = updates, st.MaxUpdates
		r.PsWaitSeconds, r.PsRefused = st.WaitSeconds, st.Refused
	}
}

// compressStats reports the pushes' counters, summed over the shards
// (the progress and result carry them).
func (c *psClient) compressStats() compress.Stats {
	var s compress.Stats
	for _, l := range c.links {
		st := l.push.Stats()
		s.Steps = max(s.Steps, st.Steps)
		s.RawBytes += st.RawBytes
		s.SentBytes += st.SentBytes
		s.CompressSeconds += st.CompressSeconds
	}
	return s
}

func (c *psClient) close() {
	for _, l := range c.links {
		if l.stream != nil {
			_ = l.stream.CloseSend()
		}
		l.in.Release()
	}
	c.cancel()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// explain names the shard an error came from: which one, of how many,
// where, and whether the step timeout ended it.
func (l *psLink) explain(err error) error {
	c := l.c
	who := "parameter server"
	if len(c.links) > 1 || l.addr != "" {
		who = fmt.Sprintf("parameter-server shard %d of %d", l.index, max(c.a.Spec.GetParameterServer().GetShards(), 1))
		if l.addr != "" {
			who += " (aggregator " + l.addr + ")"
		}
	}
	if c.timedOut.Load() {
		return fmt.Errorf("%s: no answer within the step timeout of %v: %w", who, c.timeout, err)
	}
	return fmt.Errorf("%s: %w", who, err)
}

// recvErr turns a Send error into the stream's real status: gRPC reports
// io.EOF on Send when the server ended the stream, and the reason comes
// from Recv.
func (l *psLink) recvErr(err error) error {
	if _, rerr := l.stream.Recv(); rerr != nil {
		return rerr
	}
	return err
}

// recv reads the shard's next message into l.in, after releasing the
// previous one's buffers. A Recv cannot take a context: when ctx ends,
// stepContext ends the stream, which ends the Recv.
func (l *psLink) recv(ctx context.Context) (*framecodec.SyncResponse, error) {
	l.in.Release()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := l.stream.RecvMsg(&l.in); err != nil {
		return nil, err
	}
	return &l.in, nil
}

// linkSender is a link's compress.PSSender for one step: it tags the
// pusher's frames like tag and is bounded by the step's context.
type linkSender struct {
	l   *psLink
	ctx context.Context
	tag *pb.TensorFrame
}

// SendFrame implements compress.PSSender: an encoded gradient frame.
func (s linkSender) SendFrame(f *compress.PSFrame) error {
	l := s.l
	if err := s.ctx.Err(); err != nil {
		return err
	}
	l.c.metrics.AddBytesSent(l.c.a.JobId, "ps", len(f.Data)+len(f.Scales))
	return l.stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: psstep.Frame(s.tag, f)}})
}

// SendF32 implements compress.PSSender: a float32 gradient frame whose
// values gRPC writes straight from vals; it returns once they are
// written, or the step's context ended.
func (s linkSender) SendF32(f *compress.PSFrame, vals []float32) error {
	l := s.l
	l.c.metrics.AddBytesSent(l.c.a.JobId, "ps", 4*len(vals))
	return l.out.Send(s.ctx, l.stream, nil, framecodec.FieldGradient, psstep.Frame(s.tag, f), vals)
}

// recvParams reads the shard's whole parameter range tagged with step,
// straight from gRPC's receive buffers into params; sendState reports
// that the server asks for this rank's compression state (for a
// checkpoint).
func (l *psLink) recvParams(ctx context.Context, params []float32, step int64) (sendState bool, err error) {
	c := l.c
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PULL_PARAMETERS, Step: step, Total: uint64(len(params))}, 0)
	for !asm.Done() {
		m, err := l.recv(ctx)
		if err != nil {
			return false, l.explain(err)
		}
		if !m.HasParameters {
			_, _, err := asm.Take(nil, 0, 0)
			return false, l.explain(err)
		}
		if err := m.Parameters.Assemble(&asm, params); err != nil {
			return false, l.explain(err)
		}
		if m.Receipt != nil {
			l.receipt = m.Receipt
		}
		c.metrics.AddBytesReceived(c.a.JobId, "ps", m.Parameters.NBytes)
		sendState = sendState || m.SendState
	}
	return sendState, nil
}
