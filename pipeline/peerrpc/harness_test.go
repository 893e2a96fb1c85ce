package peerrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/gradsync/gradsync/pipeline/peerrpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// worker is one stage's process: a gRPC server with the Pipeline
// endpoint on a bufconn listener.
type worker struct {
	lis  *bufconn.Listener
	srv  *grpc.Server
	ep   *peerrpc.Endpoint
	done chan struct{} // closed when Serve returned
}

func newWorker() *worker {
	w := &worker{lis: bufconn.Listen(8 << 20), srv: grpc.NewServer(), ep: peerrpc.NewEndpoint(), done: make(chan struct{})}
	pb.RegisterPipelineServer(w.srv, w.ep)
	go func() {
		defer close(w.done)
		_ = w.srv.Serve(w.lis)
	}()
	return w
}

// conn is a client connection to w.
func (w *worker) conn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return w.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stop ends w as a dying process would: every connection to it closes.
func (w *worker) stop() {
	w.ep.Close()
	w.srv.Stop()
	<-w.done
}

// cluster is S workers with the links between them: prev[s] and next[s]
// are stage s's ends (nil where there is no neighbour).
type cluster struct {
	workers    []*worker
	conns      []*grpc.ClientConn // conns[s]: stage s to stage s+1
	prev, next []*peerrpc.Link
}

// connect starts S workers and links them: every Accept and Dial at once.
func connect(ctx context.Context, t testing.TB, job string, gen uint64, S int) *cluster {
	t.Helper()
	c := &cluster{prev: make([]*peerrpc.Link, S), next: make([]*peerrpc.Link, S)}
	for range S {
		c.workers = append(c.workers, newWorker())
	}
	for s := range S - 1 {
		c.conns = append(c.conns, c.workers[s+1].conn(t))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2*S)
	for s := range S {
		if s > 0 {
			wg.Go(func() { c.prev[s], errs[2*s] = c.workers[s].ep.Accept(ctx, job, gen, s) })
		}
		if s < S-1 {
			wg.Go(func() { c.next[s], errs[2*s+1] = peerrpc.Dial(ctx, c.conns[s], job, gen, s) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.close()
		t.Fatal(err)
	}
	return c
}

// close closes every link, connection and worker and waits for them.
func (c *cluster) close() {
	for _, ls := range [][]*peerrpc.Link{c.prev, c.next} {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	}
	for _, cc := range c.conns {
		cc.Close()
	}
	for _, w := range c.workers {
		w.stop()
	}
}

func (c *cluster) String() string { return fmt.Sprintf("cluster of %d stages", len(c.workers)) }
