package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/logbuf"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestForeignPeerRefused: the socket hands on only connections whose
// peer runs as the required user (the kernel's SO_PEERCRED): with the
// test's own uid required, a call goes through; with another uid
// required, the very same client is refused (Unavailable), nothing
// reaches the agent, and the refusal is logged with the peer's uid.
func TestForeignPeerRefused(t *testing.T) {
	for _, foreign := range []bool{false, true} {
		ring := aggregator.NewMemRing(1, 4)
		s, err := New(Config{Ring: ring[0], JobID: "job-1", Generation: 1, StepTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		k, err := Listen(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if foreign {
			k.uid = ownUID() + 1
		}
		var logs logbuf.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- k.Serve(ctx, s, slog.New(slog.NewTextHandler(&logs, nil))) }() // owned: cancel, then <-done
		conn, err := grpc.NewClient("unix://"+k.Path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second) // a bound, not an assertion: a refused peer fails at once
		_, err = pb.NewAgentClient(conn).Init(cctx, &pb.AgentInitRequest{})
		ccancel()
		conn.Close()
		cancel()
		if serr := <-done; serr != nil {
			t.Error(serr)
		}
		s.Close()
		ring[0].(*aggregator.MemRing).Close()
		switch {
		case !foreign && err != nil:
			t.Errorf("own uid: Init: %v; want it served", err)
		case foreign && status.Code(err) != codes.Unavailable:
			t.Errorf("foreign uid: Init: %v; want Unavailable (connection refused)", err)
		case foreign && !strings.Contains(logs.String(), "connection refused") || foreign && !strings.Contains(logs.String(), "peer is another user"):
			t.Errorf("foreign uid: log %q; want the refusal with the peer's uid", logs.String())
		}
	}
}
