package paramserver_test

import (
	"context"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/paramserver"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// sumsService routes Reduce streams to one job's Sums, as the
// coordinator's handler does.
type sumsService struct {
	pb.UnimplementedParameterServerServer
	g *paramserver.Sums
}

func (s sumsService) Reduce(stream pb.ParameterServer_ReduceServer) error {
	join, err := paramserver.RecvReduceJoin(stream)
	if err != nil {
		return err
	}
	return s.g.Serve(stream, join)
}

// sumsWorld is an entrypoint job's summation shards served over an
// in-memory listener, and a client for each of its ranks.
type sumsWorld struct {
	g       *paramserver.Sums
	clients []*paramserver.ScriptClient
	stop    func() // stops the gRPC server (the shards' host dies)
}

func newSumsWorld(t *testing.T, world, shards int, timeout time.Duration) *sumsWorld {
	t.Helper()
	g := paramserver.NewSums(paramserver.Env{Now: time.Now, Log: slog.New(slog.DiscardHandler)}, "job-s", 1, world, shards, timeout)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterParameterServerServer(srv, sumsService{g: g})
	served := make(chan struct{})
	go func() { // owned by the test: ends with srv.Stop
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	w := &sumsWorld{g: g}
	var once sync.Once
	w.stop = func() { once.Do(func() { srv.Stop(); <-served }) }
	for r := range world {
		c, err := paramserver.DialScript(t.Context(), []grpc.ClientConnInterface{conn}, paramserver.ScriptConfig{JobID: "job-s", Generation: 1, Rank: r, World: world,
			Shards: shards, Where: []string{"the test's server"}})
		if err != nil {
			t.Fatal(err)
		}
		w.clients = append(w.clients, c)
	}
	t.Cleanup(func() {
		for _, c := range w.clients {
			c.Abort()
		}
		g.Abort(context.Canceled)
		conn.Close()
		w.stop()
	})
	return w
}

// onRanks runs fn for every rank concurrently and returns their errors.
func onRanks(n int, fn func(rank int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { // owned by onRanks
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

func callCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestSumsCollectives: sums of rank-valued inputs whose exact sum is known
// (lengths around the number of shards, and more than a frame), a
// broadcast that keeps negative zeros and NaN payloads bit for bit, a
// barrier and a layout, with one shard and with two; every rank gets the
// same bytes.
func TestSumsCollectives(t *testing.T) {
	const world = 3
	for _, shards := range []int{1, 2} {
		w := newSumsWorld(t, world, shards, time.Minute)
		ctx := callCtx(t, time.Minute)
		seq := int64(0)
		lay := psstep.Call{Kind: psstep.CallLayout, Lay: psstep.Layout{Elements: 300000, Checksum: 0xfeed}}
		for _, length := range []int{1, 2, 3, 300000} {
			out := make([][]float32, world)
			calls := []psstep.Call{{Seq: seq, Kind: psstep.CallSum}}
			if length == 300000 {
				// A gradient bucket of several frames, after its layout.
				lay.Seq = seq
				calls = []psstep.Call{lay, {Seq: seq + 1, Kind: psstep.CallSum}}
			}
			errs := onRanks(world, func(r int) error {
				buf := make([]float32, length)
				for i := range buf {
					buf[i] = float32(r + 1 + i%7)
				}
				for _, c := range calls {
					b := buf
					if c.Kind == psstep.CallLayout {
						b = nil
					}
					if err := w.clients[r].Do(ctx, c, b); err != nil {
						return err
					}
				}
				out[r] = buf
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("shards %d, length %d, rank %d: %v", shards, length, r, err)
				}
			}
			for i := range length {
				want := float32(world*(world+1)/2 + world*(i%7))
				for r := range world {
					if out[r][i] != want {
						t.Fatalf("shards %d, length %d: rank %d [%d] = %v, want %v", shards, length, r, i, out[r][i], want)
					}
				}
			}
			seq += int64(len(calls))
		}
		payload := []float32{float32(math.Copysign(0, -1)), math.Float32frombits(0x7fc00123), 3, float32(math.Inf(-1))}
		errs := onRanks(world, func(r int) error {
			buf := make([]float32, len(payload))
			if r == 2 {
				copy(buf, payload)
			}
			if err := w.clients[r].Do(ctx, psstep.Call{Seq: seq, Kind: psstep.CallBroadcast, Root: 2}, buf); err != nil {
				return err
			}
			for i, v := range buf {
				if math.Float32bits(v) != math.Float32bits(payload[i]) {
					t.Errorf("shards %d: rank %d got %08x at %d, want root's %08x", shards, r, math.Float32bits(v), i, math.Float32bits(payload[i]))
				}
			}
			return w.clients[r].Do(ctx, psstep.Call{Seq: seq + 1, Kind: psstep.CallBarrier}, nil)
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("shards %d: rank %d: %v", shards, r, err)
			}
		}
	}
}

// TestSumsDisagreement: ranks whose layouts differ all fail with
// FailedPrecondition naming the layouts.
func TestSumsDisagreement(t *testing.T) {
	w := newSumsWorld(t, 2, 1, time.Minute)
	ctx := callCtx(t, time.Minute)
	errs := onRanks(2, func(r int) error {
		return w.clients[r].Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallLayout, Lay: psstep.Layout{Elements: int64(10 + r), Checksum: 1}}, nil)
	})
	for r, err := range errs {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "registered another gradient layout") {
			t.Fatalf("rank %d: %v, want FailedPrecondition naming the layouts", r, err)
		}
	}
}

// TestSumsRankNeverCalls: a rank whose script makes no call is named,
// with DeadlineExceeded, to the rank that waits, by the step timeout.
func TestSumsRankNeverCalls(t *testing.T) {
	const timeout = 200 * time.Millisecond
	w := newSumsWorld(t, 2, 2, timeout)
	ctx := callCtx(t, timeout)
	err := w.clients[0].Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallSum}, make([]float32, 10))
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "rank(s) [1] never joined it within the step timeout") {
		t.Fatalf("%v, want DeadlineExceeded naming rank 1", err)
	}
}

// TestSumsRankLeaves: a rank whose streams break (its worker stopped it:
// its script failed) is named at once to the rank waiting in a call,
// without waiting for the step timeout.
func TestSumsRankLeaves(t *testing.T) {
	w := newSumsWorld(t, 2, 1, time.Hour)
	ctx := callCtx(t, time.Minute)
	for r, err := range onRanks(2, func(r int) error { return w.clients[r].Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallBarrier}, nil) }) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	done := make(chan error, 1)
	go func() { // owned by the test: ends when the shard answers
		done <- w.clients[0].Do(ctx, psstep.Call{Seq: 1, Kind: psstep.CallBarrier}, nil)
	}()
	w.clients[1].Abort()
	err := <-done
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rank 1 left") {
		t.Fatalf("%v, want Unavailable naming rank 1", err)
	}
}

// TestSumsShardGone: a rank whose shards' host stops mid call is told
// which shard, with Unavailable, at once.
func TestSumsShardGone(t *testing.T) {
	w := newSumsWorld(t, 2, 1, time.Hour)
	ctx := callCtx(t, time.Minute)
	done := make(chan error, 1)
	go func() { // owned by the test: ends when the stream breaks
		done <- w.clients[0].Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallSum}, []float32{1})
	}()
	w.stop()
	err := <-done
	if c := status.Code(err); (c != codes.Unavailable && c != codes.Aborted) || !strings.Contains(err.Error(), "parameter-server shard 0 of 1 on the test's server") {
		t.Fatalf("%v, want Unavailable naming shard 0", err)
	}
}

// TestShardServerSums: `gradsync aggregator` processes host an entrypoint
// job's summation shards, learnt from the joins' spec (here one process
// hosts both shards); a rank with another spec is refused, and once
// every stream has closed the shards are gone for good.
func TestShardServerSums(t *testing.T) {
	agg, err := paramserver.NewShardServer(paramserver.ShardServerConfig{Insecure: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterParameterServerServer(srv, agg)
	served := make(chan struct{})
	go func() { // owned by the test: ends with srv.Stop
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	spec := func(seed int64) *pb.JobSpec {
		return &pb.JobSpec{Workers: proto.Int32(2), Mode: "ps", Seed: proto.Int64(seed), Entrypoint: &pb.EntrypointSpec{Command: []string{"train"}},
			ParameterServer: &pb.ParameterServerSpec{Shards: 2, Addresses: []string{"bufnet:1", "bufnet:2"}}}
	}
	ctx := callCtx(t, time.Minute)
	dial := func(rank int, s *pb.JobSpec) *paramserver.ScriptClient {
		c, err := paramserver.DialScript(ctx, []grpc.ClientConnInterface{conn, conn}, paramserver.ScriptConfig{JobID: "job-a", Generation: 1,
			Rank: rank, World: 2, Shards: 2, Spec: s, Where: []string{"aggregator bufnet:1", "aggregator bufnet:2"}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	clients := []*paramserver.ScriptClient{dial(0, spec(1)), dial(1, spec(1))}
	out := make([][]float32, 2)
	for r, err := range onRanks(2, func(r int) error {
		out[r] = []float32{float32(r), 1, 2}
		return clients[r].Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallSum}, out[r])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if out[0][0] != 1 || out[1][2] != 4 {
		t.Fatalf("sums %v, want [1 2 4] on both ranks", out)
	}
	// A rank whose spec differs is refused at its first call.
	other := dial(1, spec(2))
	err = other.Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallBarrier}, nil)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "differs from the first rank's") {
		t.Fatalf("another spec: %v, want InvalidArgument", err)
	}
	for _, c := range clients {
		c.Close(ctx)
	}
	if agg.Jobs() != 0 {
		t.Fatalf("%d shards still held after every stream closed", agg.Jobs())
	}
	late := dial(0, spec(1))
	defer late.Abort()
	if err := late.Do(ctx, psstep.Call{Seq: 0, Kind: psstep.CallBarrier}, nil); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a join after the end: %v, want FailedPrecondition", err)
	}
}
