package ringrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/peertest"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/aggregator/ringtest"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// cluster is n worker processes' worth of Collective servers in this test
// process, on bufconn or on TCP loopback.
type cluster struct {
	eps      []*ringrpc.Endpoint
	servers  []*grpc.Server
	addrs    []string
	dialOpts []grpc.DialOption
}

func newCluster(t *testing.T, n int, tcp bool) *cluster {
	t.Helper()
	c := &cluster{}
	lis := make([]net.Listener, n)
	bufs := map[string]*bufconn.Listener{}
	for i := range n {
		if tcp {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			lis[i] = l
			c.addrs = append(c.addrs, l.Addr().String())
		} else {
			l := bufconn.Listen(8 << 20)
			lis[i] = l
			addr := fmt.Sprintf("rank%d", i)
			bufs[addr] = l
			c.addrs = append(c.addrs, "passthrough:///"+addr)
		}
	}
	if !tcp {
		c.dialOpts = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			l, ok := bufs[addr]
			if !ok {
				return nil, fmt.Errorf("no bufconn listener %q", addr)
			}
			return l.DialContext(ctx)
		})}
	}
	log := slog.New(slog.DiscardHandler)
	var wg sync.WaitGroup
	for i := range n {
		ep := ringrpc.NewEndpoint(log)
		s := grpc.NewServer(append(rpc.ServerOptions(log, nil, nil), ringrpc.ServerOptions()...)...)
		pb.RegisterCollectiveServer(s, ep)
		c.eps = append(c.eps, ep)
		c.servers = append(c.servers, s)
		wg.Go(func() { _ = s.Serve(lis[i]) })
	}
	t.Cleanup(func() {
		for i := range n {
			c.kill(i)
		}
		wg.Wait()
	})
	return c
}

// kill stops rank i's process: its endpoint and its server.
func (c *cluster) kill(i int) {
	c.eps[i].Close()
	c.servers[i].Stop()
}

var jobSeq atomic.Int64

// join makes a ring of every rank of c for a new job.
func (c *cluster) join(t *testing.T, gen uint64) []*ringrpc.Ring {
	t.Helper()
	job := fmt.Sprintf("job-%d", jobSeq.Add(1))
	return c.joinJob(t, job, gen)
}

func (c *cluster) joinJob(t *testing.T, job string, gen uint64) []*ringrpc.Ring {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	n := len(c.eps)
	rings := make([]*ringrpc.Ring, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rings[i], errs[i] = c.eps[i].Join(ctx, ringrpc.RingConfig{
				JobID: job, Generation: gen, Rank: i, Peers: c.addrs, DialOptions: c.dialOpts,
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		{
			for _, r := range rings {
				if r != nil {
					r.Close()
				}
			}
			t.Fatalf("join: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rings {
			r.Close()
		}
	})
	return rings
}

// suiteRings adapts clusters to ringtest: one cluster per world size, a
// new job per call, so that endpoints serve many rings over the test.
func suiteRings(t *testing.T, tcp bool) func(t *testing.T, n int) []aggregator.Ring {
	clusters := map[int]*cluster{}
	var mu sync.Mutex
	return func(st *testing.T, n int) []aggregator.Ring {
		mu.Lock()
		c := clusters[n]
		if c == nil {
			c = newCluster(t, n, tcp) // lives as long as the top-level test
			clusters[n] = c
		}
		mu.Unlock()
		rs := c.join(st, 0) // the suite's calls use Options.Generation 0 to 7
		out := make([]aggregator.Ring, n)
		for i, r := range rs {
			out[i] = r
		}
		return out
	}
}

// The two suites run side by side (each on its own clusters, after the
// package's other tests): their time is mostly spent waiting on the
// wire, so together they take little longer than the TCP one alone.
func TestSuiteBufconn(t *testing.T) {
	t.Parallel()
	ringtest.Run(t, suiteRings(t, false))
}

func TestSuiteTCP(t *testing.T) {
	t.Parallel()
	ringtest.Run(t, suiteRings(t, true))
}

// rawStream opens a SendFrames stream to addr the way any gRPC client
// would (the proto codec), claiming to be rank from job at gen.
func rawStream(t *testing.T, c *cluster, to int, job string, gen uint64, rank int) (pb.Collective_SendFramesClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(c.addrs[to], append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, c.dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	ctx = metadata.AppendToOutgoingContext(ctx, "gradsync-job", job, "gradsync-generation", fmt.Sprint(gen), "gradsync-rank", fmt.Sprint(rank))
	s, err := pb.NewCollectiveClient(conn).SendFrames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s, func() { cancel(); conn.Close() }
}

func frame(job string, gen uint64, rank int, vals []float32) *pb.SendFramesRequest {
	data := make([]byte, 4*len(vals))
	wire.PutF32(data, vals)
	return &pb.SendFramesRequest{Frame: &pb.TensorFrame{
		JobId: job, Generation: gen, Op: pb.Op_OP_ALL_REDUCE, Step: 1, Rank: int32(rank),
		Dtype: pb.DType_D_TYPE_F32, Data: data,
	}}
}

// TestStaleGenerationRefused: a stream or frame of an older generation is
// refused with Aborted, an unknown job with NotFound, and the current
// ring's all-reduce is unaffected: the stale data is never summed.
func TestStaleGenerationRefused(t *testing.T) {
	c := newCluster(t, 2, false)
	rings := c.joinJob(t, "j", 5)

	for _, tc := range []struct {
		name string
		job  string
		gen  uint64
		want codes.Code
	}{
		{"stale", "j", 4, codes.Aborted},
		{"unknown job", "other", 5, codes.NotFound},
		{"not the left neighbour", "j", 5, codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rank := 0
			if tc.want == codes.FailedPrecondition {
				rank = 1 // rank 1 is not rank 1's left neighbour
			}
			s, done := rawStream(t, c, 1, tc.job, tc.gen, rank)
			defer done()
			_ = s.Send(frame(tc.job, tc.gen, rank, []float32{1e6, 1e6, 1e6}))
			_, err := s.CloseAndRecv()
			if status.Code(err) != tc.want {
				t.Fatalf("got %v, want code %v", err, tc.want)
			}
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	bufs := [][]float32{{1, 2, 3}, {10, 20, 30}}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range rings {
		wg.Go(func() { errs[i] = aggregator.AllReduce(ctx, r, bufs[i], 1, aggregator.Options{Generation: 5}) })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("rank %d: %v", i, errs[i])
		}
		if got, want := fmt.Sprint(bufs[i]), "[11 22 33]"; got != want {
			t.Errorf("rank %d: %v, want %v", i, got, want)
		}
	}
}

// TestStaleFrameMidStream: on an accepted stream, a frame of an older
// generation ends the stream with Aborted and is never delivered; the
// frame before it is, and then the ring reports its left neighbour gone.
func TestStaleFrameMidStream(t *testing.T) {
	c := newCluster(t, 2, false)
	// Rank 0 is played by hand: a sink takes rank 1's stream, and
	// rawStream is rank 0's stream into rank 1.
	sink := newSink(t)
	addrs := []string{sink.addr, c.addrs[1]}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type res struct {
		r   *ringrpc.Ring
		err error
	}
	joined := make(chan res, 1)
	go func() {
		r, err := c.eps[1].Join(ctx, ringrpc.RingConfig{JobID: "j", Generation: 5, Rank: 1, Peers: addrs,
			DialOptions: append(c.dialOpts, sink.dialOpt)})
		joined <- res{r, err}
	}()
	var s pb.Collective_SendFramesClient
	for { // until rank 1 has registered the ring
		var done context.CancelFunc
		s, done = rawStream(t, c, 1, "j", 5, 0)
		defer done()
		if hdr, err := s.Header(); err == nil && len(hdr.Get("gradsync-accepted")) > 0 {
			break
		}
		if _, err := s.CloseAndRecv(); status.Code(err) != codes.NotFound {
			t.Fatalf("before rank 1 joined: got %v, want NotFound", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	j := <-joined
	if j.err != nil {
		t.Fatal(j.err)
	}
	defer j.r.Close()
	if err := s.Send(frame("j", 5, 0, []float32{1, 2})); err != nil {
		t.Fatal(err)
	}
	_ = s.Send(frame("j", 4, 0, []float32{1e6, 1e6}))
	if _, err := s.CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Fatalf("stale frame: got %v, want Aborted", err)
	}
	f, err := j.r.RecvLeft(ctx)
	if err != nil || fmt.Sprint(f.Data) != "[1 2]" || f.Generation != 5 {
		t.Fatalf("first frame: %+v, %v; want data [1 2] from generation 5", f, err)
	}
	f, err = j.r.RecvLeft(ctx)
	if pe := new(aggregator.PeerError); !errors.As(err, &pe) || pe.Rank != 0 || !errors.Is(err, aggregator.ErrPeerGone) {
		t.Fatalf("after the stale frame: got %+v, %v; want a *PeerError naming rank 0", f, err)
	}
}

// sink is a Collective server that accepts any stream and drops its frames.
type sink struct {
	pb.UnimplementedCollectiveServer
	addr    string
	dialOpt grpc.DialOption
}

func newSink(t *testing.T) *sink {
	l := bufconn.Listen(1 << 20)
	s := &sink{addr: "passthrough:///sink"}
	s.dialOpt = grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if addr != "sink" {
			return nil, fmt.Errorf("no listener %q", addr)
		}
		return l.DialContext(ctx)
	})
	gs := grpc.NewServer()
	pb.RegisterCollectiveServer(gs, s)
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(l) })
	t.Cleanup(func() { gs.Stop(); wg.Wait() })
	return s
}

func (s *sink) SendFrames(stream pb.Collective_SendFramesServer) error {
	if err := stream.SendHeader(metadata.Pairs("gradsync-accepted", "1")); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// TestKillRank stops one rank's process (endpoint and server) before and
// during an all-reduce over TCP: every other rank fails within the
// deadline, and both neighbours name the dead rank.
func TestKillRank(t *testing.T) {
	const n, victim = 4, 2
	for _, when := range []string{"before", "during"} {
		t.Run(when, func(t *testing.T) {
			c := newCluster(t, n, true)
			rings := c.join(t, 1)
			if when == "before" {
				c.kill(victim)
			}
			const deadline = 3 * time.Second
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, n)
			took := make([]time.Duration, n)
			for i, r := range rings {
				if i == victim && when == "before" {
					continue
				}
				wg.Go(func() {
					start := time.Now()
					errs[i] = aggregator.AllReduce(ctx, r, make([]float32, 1<<22), 1, aggregator.Options{MaxFrameElems: 1 << 12, Generation: 1})
					took[i] = time.Since(start)
				})
			}
			if when == "during" {
				time.Sleep(50 * time.Millisecond)
				c.kill(victim)
			}
			wg.Wait()
			for i := range n {
				if i == victim {
					continue
				}
				if errs[i] == nil {
					t.Errorf("rank %d succeeded; want an error", i)
				}
				if took[i] > deadline+2*time.Second {
					t.Errorf("rank %d returned after %v; deadline %v", i, took[i], deadline)
				}
			}
			for _, i := range []int{victim - 1, victim + 1} {
				pe := new(aggregator.PeerError)
				if !errors.As(errs[i], &pe) || pe.Rank != victim || !errors.Is(errs[i], aggregator.ErrPeerGone) {
					t.Errorf("rank %d: got %v, want a *PeerError naming rank %d", i, errs[i], victim)
				}
			}
		})
	}
}

// TestShutdownDeliversLastFrames: each rank shuts its ring down right after
// its last collective; no rank loses the frames it still needed.
func TestShutdownDeliversLastFrames(t *testing.T) {
	c := newCluster(t, 3, true)
	for round := range 5 {
		rings := c.join(t, uint64(round+1))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		var wg sync.WaitGroup
		errs := make([]error, len(rings))
		for i, r := range rings {
			wg.Go(func() {
				buf := make([]float32, 100003)
				for j := range buf {
					buf[j] = 1
				}
				if err := aggregator.AllReduce(ctx, r, buf, 1, aggregator.Options{Generation: r.Generation()}); err != nil {
					errs[i] = err
					return
				}
				if buf[len(buf)-1] != 3 || buf[0] != 3 {
					errs[i] = fmt.Errorf("got %v..%v, want 3", buf[0], buf[len(buf)-1])
				}
				errs[i] = errors.Join(errs[i], r.Shutdown(ctx))
			})
		}
		wg.Wait()
		cancel()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", round, i, err)
			}
		}
	}
}

// TestNewGenerationReplacesOld: joining a job at a higher generation
// closes the old ring; an equal or lower one is refused.
func TestNewGenerationReplacesOld(t *testing.T) {
	c := newCluster(t, 2, false)
	old := c.joinJob(t, "j", 1)
	fresh := c.joinJob(t, "j", 2)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := old[0].RecvLeft(ctx); !errors.Is(err, aggregator.ErrClosed) {
		t.Errorf("old ring: got %v, want ErrClosed", err)
	}
	if _, err := c.eps[0].Join(ctx, ringrpc.RingConfig{JobID: "j", Generation: 2, Peers: c.addrs, DialOptions: c.dialOpts}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("rejoin at the same generation: got %v, want FailedPrecondition", err)
	}
	var wg sync.WaitGroup
	for _, r := range fresh {
		wg.Go(func() {
			if err := aggregator.Barrier(ctx, r, 1, aggregator.Options{Generation: 2}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestWaitStatsFindLateLeftNeighbour: rank 1 enters every all-reduce
// 150 ms after the others, so its right neighbour (rank 2) waits about
// that long for its first frame and the others hardly at all; frame counts
// match link by link.
func TestWaitStatsFindLateLeftNeighbour(t *testing.T) {
	const rounds, late = 3, 150 * time.Millisecond
	c := newCluster(t, 3, true)
	rings := c.join(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(rings))
	var wg sync.WaitGroup
	for i, r := range rings {
		wg.Go(func() {
			buf := make([]float32, 10007)
			for round := range rounds {
				if i == 1 {
					time.Sleep(late) // the injected lateness, not synchronisation
				}
				if err := aggregator.AllReduce(ctx, r, buf, int64(round), aggregator.Options{Generation: 1}); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var waited [3]time.Duration
	for i, r := range rings {
		n, w := r.WaitStats()
		if n != rounds {
			t.Errorf("rank %d: %d collectives counted, want %d", i, n, rounds)
		}
		waited[i] = w
	}
	t.Logf("waits for the left neighbour: %v", waited)
	if waited[2] < rounds*late*2/3 {
		t.Errorf("rank 2 waited %v for late rank 1 over %d rounds; want about %v", waited[2], rounds, rounds*late)
	}
	for _, i := range []int{0, 1} {
		if waited[i] > waited[2]/3 {
			t.Errorf("rank %d waited %v, rank 2 %v: only rank 2's left neighbour was late", i, waited[i], waited[2])
		}
	}
	for i, r := range rings {
		sent, _ := r.FrameCounts()
		_, arrived := rings[(i+1)%3].FrameCounts()
		if sent == 0 || sent != arrived {
			t.Errorf("link %d → %d: %d frames sent, %d arrived", i, (i+1)%3, sent, arrived)
		}
	}
}

// TestShutdownAfterAbandonedCollective: once a collective gave up half-way
// (its context ended while the neighbour stayed silent), Shutdown closes
// at once instead of waiting for last frames nobody will send.
func TestShutdownAfterAbandonedCollective(t *testing.T) {
	c := newCluster(t, 2, true)
	rings := c.join(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := aggregator.AllReduce(ctx, rings[0], make([]float32, 100), 1, aggregator.Options{Generation: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AllReduce with a silent neighbour: %v; want a deadline error", err)
	}
	sctx, scancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer scancel()
	if err := rings[0].Shutdown(sctx); err == nil || !strings.Contains(err.Error(), "abandoned") || sctx.Err() != nil {
		t.Fatalf("Shutdown after an abandoned collective: %v (ctx %v); want an immediate close", err, sctx.Err())
	}
}

// TestBrokenWhenNeighbourCloses: a rank that makes no calls learns from
// Broken that its left neighbour broke the ring; an orderly Shutdown of
// every rank breaks nothing.
func TestBrokenWhenNeighbourCloses(t *testing.T) {
	c := newCluster(t, 3, true)
	rings := c.join(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// One collective first, so that every stream is up.
	var wg sync.WaitGroup
	for _, r := range rings {
		wg.Go(func() {
			if err := aggregator.Barrier(ctx, r, 1, aggregator.Options{Generation: 1}); err != nil {
				t.Errorf("rank %d: %v", r.Rank(), err)
			}
		})
	}
	wg.Wait()
	if r := rings[1]; r.BrokenErr() != nil {
		t.Fatalf("rank 1 broken before anything happened: %v", r.BrokenErr())
	}
	rings[0].Close()
	select {
	case <-rings[1].Broken():
	case <-ctx.Done():
		t.Fatal("rank 1 never learnt that its left neighbour closed the ring")
	}
	pe := new(aggregator.PeerError)
	if err := rings[1].BrokenErr(); !errors.As(err, &pe) || pe.Rank != 0 {
		t.Errorf("rank 1: broken by %v, want a *PeerError naming rank 0", err)
	}
	select {
	case <-rings[0].Broken():
		t.Error("rank 0 closed its own ring and calls it broken")
	default:
	}
	rings[1].Close()
	rings[2].Close()

	// Orderly: every rank shuts down after a collective; none is broken.
	rings = c.join(t, 2)
	for _, r := range rings {
		wg.Go(func() {
			err := aggregator.Barrier(ctx, r, 1, aggregator.Options{Generation: 2})
			if err == nil {
				err = r.Shutdown(ctx)
			}
			if err != nil {
				t.Errorf("rank %d: %v", r.Rank(), err)
			}
		})
	}
	wg.Wait()
	for _, r := range rings {
		if err := r.BrokenErr(); err != nil {
			t.Errorf("rank %d: an orderly shutdown broke it: %v", r.Rank(), err)
		}
	}
}

// TestPeersSuite runs the peer all-reduce suite (ring, halving-doubling,
// tree) over aggregator.PairPeers made of one two-rank gRPC ring per pair
// of ranks (a job of its own on the two ranks' endpoints), on bufconn.
func TestPeersSuite(t *testing.T) {
	t.Parallel()
	clusters := map[int]*cluster{}
	var mu sync.Mutex
	peertest.Run(t, func(st *testing.T, n int) []aggregator.Peers {
		mu.Lock()
		c := clusters[n]
		if c == nil {
			c = newCluster(t, n, false) // lives as long as the top-level test
			clusters[n] = c
		}
		mu.Unlock()
		job := fmt.Sprintf("job-%d", jobSeq.Add(1))
		return peertest.Pairs(n, func(i, j int) (aggregator.Ring, aggregator.Ring) {
			pc := &cluster{eps: []*ringrpc.Endpoint{c.eps[i], c.eps[j]}, addrs: []string{c.addrs[i], c.addrs[j]}, dialOpts: c.dialOpts}
			rs := pc.joinJob(st, fmt.Sprintf("%s/pair-%d-%d", job, i, j), 0)
			return rs[0], rs[1]
		}) // joinJob's cleanup closes the rings
	})
}
