package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/internal/rpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// SocketName is the socket's file name inside the directory Listen makes.
const SocketName = "agent.sock"

// Socket is a listening agent socket: a Unix socket of mode 0600 in a
// fresh directory of mode 0700, so that only the worker's user (and root)
// can connect; and Serve hands on only connections whose peer process
// runs as the worker's user (SO_PEERCRED, peerListener), so root's or
// another user's processes are refused even if the modes were opened.
type Socket struct {
	Path string // the socket's path, for GRADSYNC_AGENT
	dir  string
	lis  net.Listener
	bell net.Listener // the bell (BellName), beside it, as private
	uid  int          // the peers' required uid: the worker's own
}

// Listen makes the socket under parent (os.TempDir() when empty).
func Listen(parent string) (*Socket, error) {
	dir, err := os.MkdirTemp(parent, "gradsync-agent-")
	if err != nil {
		return nil, fmt.Errorf("agent: socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("agent: socket directory: %w", err)
	}
	path := filepath.Join(dir, SocketName)
	lis, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("agent: listen on %s: %w", path, err)
	}
	bellPath := filepath.Join(dir, BellName)
	bell, err := net.Listen("unix", bellPath)
	if err != nil {
		lis.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("agent: listen on %s: %w", bellPath, err)
	}
	for _, p := range []string{path, bellPath} {
		if err := os.Chmod(p, 0o600); err != nil {
			lis.Close()
			bell.Close()
			os.RemoveAll(dir)
			return nil, fmt.Errorf("agent: socket mode: %w", err)
		}
	}
	return &Socket{Path: path, dir: dir, lis: lis, bell: bell, uid: ownUID()}, nil
}

// Serve serves s on the socket until ctx is done, then stops the server
// (calls in flight are cancelled) and removes the socket's directory. The
// socket cannot be served again.
func (k *Socket) Serve(ctx context.Context, s *Server, log *slog.Logger) error {
	return k.serve(ctx, log, func(gs *grpc.Server) { pb.RegisterAgentServer(gs, s) }, s)
}

// ServeFed is Serve for the FedAgent service of a fedavg entrypoint
// job's script.
func (k *Socket) ServeFed(ctx context.Context, s *FedServer, log *slog.Logger) error {
	return k.serve(ctx, log, func(gs *grpc.Server) { pb.RegisterFedAgentServer(gs, s) }, nil)
}

// serve serves the services register registers on the socket, and the
// bell for bell (nil: no bell; its socket is closed at once).
func (k *Socket) serve(ctx context.Context, log *slog.Logger, register func(*grpc.Server), bell *Server) error {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Stop waits for the handlers, so that nothing uses the shared region
	// after Serve returns.
	gs := grpc.NewServer(append(rpc.ServerOptions(log, nil, nil), grpc.WaitForHandlers(true))...)
	register(gs)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // owned by Serve: stops the servers when ctx is done
		defer wg.Done()
		<-ctx.Done()
		gs.Stop()
		k.bell.Close()
	}()
	go func() { // owned by Serve: the bell's connections
		defer wg.Done()
		if bell == nil {
			k.bell.Close()
			return
		}
		serveBells(ctx, &peerListener{Listener: k.bell, uid: k.uid, log: log}, bell, log)
	}()
	err := gs.Serve(&peerListener{Listener: k.lis, uid: k.uid, log: log})
	cancel()
	wg.Wait()
	os.RemoveAll(k.dir)
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// serveBells accepts the bell's connections until lis is closed, and
// returns once every connection's requests have ended.
func serveBells(ctx context.Context, lis net.Listener, s *Server, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				log.Warn("agent bell: accept", "err", err)
			}
			return
		}
		wg.Add(1)
		go func() { // owned by serveBells: one connection
			defer wg.Done()
			s.serveBell(ctx, c, log)
		}()
	}
}

// Close releases a socket that is never served.
func (k *Socket) Close() {
	k.lis.Close()
	k.bell.Close()
	os.RemoveAll(k.dir)
}
