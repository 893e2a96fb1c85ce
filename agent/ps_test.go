package agent

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// forEachMode runs test with the agents' collectives over the ring and
// over the parameter server's summation shards (two of them).
func forEachMode(t *testing.T, test func(*testing.T, func(*testing.T, int, time.Duration) *world)) {
	t.Run("ring", func(t *testing.T) { test(t, newWorld) })
	t.Run("ps", func(t *testing.T) {
		test(t, func(t *testing.T, n int, timeout time.Duration) *world { return newPSWorld(t, n, 2, timeout) })
	})
}

// sumsService routes Reduce streams to one job's shards, as the
// coordinator does.
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

// newPSWorld is n agents whose collectives go to shards summation
// shards served over an in-memory listener (mode ps).
func newPSWorld(t *testing.T, n, shards int, timeout time.Duration) *world {
	t.Helper()
	g := paramserver.NewSums(paramserver.Env{Now: time.Now, Log: slog.New(slog.DiscardHandler)}, "job-1", 3, n, shards, timeout)
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
	var clients []*paramserver.ScriptClient
	closeAll := func() {
		for _, c := range clients {
			c.Abort()
		}
		g.Abort(context.Canceled)
		conn.Close()
		srv.Stop()
		<-served
	}
	cfgs := make([]Config, n)
	for r := range n {
		c, err := paramserver.DialScript(t.Context(), []grpc.ClientConnInterface{conn}, paramserver.ScriptConfig{JobID: "job-1", Generation: 3, Rank: r, World: n,
			Shards: shards})
		if err != nil {
			closeAll()
			t.Fatal(err)
		}
		clients = append(clients, c)
		cfgs[r] = Config{Collective: c, StepTimeout: timeout}
	}
	return newWorldOf(t, cfgs, closeAll)
}
