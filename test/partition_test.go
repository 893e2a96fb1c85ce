package e2e

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// blackhole is a TCP proxy that can stop forwarding without closing
// anything, as a cut network link does: both ends keep their connections
// and hear nothing more.
type blackhole struct {
	ln     net.Listener
	target string

	mu    sync.Mutex // guards cut and conns
	cut   bool
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	b.wg.Add(1)
	go b.accept() // owned by b: Close stops it
	t.Cleanup(b.Close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", b.target)
		if err != nil {
			c.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, c, d)
		b.mu.Unlock()
		b.wg.Add(2)
		go b.pipe(d, c) // owned by b
		go b.pipe(c, d) // owned by b
	}
}

// pipe copies src to dst until src ends or the link is cut; after the cut
// it reads and drops, so the sender's writes do not fail either.
func (b *blackhole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		b.mu.Lock()
		cut := b.cut
		b.mu.Unlock()
		if cut {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_, _ = io.Copy(io.Discard, src)
			return
		}
	}
}

func (b *blackhole) Cut() {
	b.mu.Lock()
	b.cut = true
	b.mu.Unlock()
}

func (b *blackhole) Close() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// TestPartitionedWorker cuts a worker's link to the coordinator (and its
// parameter server) without closing it: missed heartbeats give it away,
// the job fails naming it within the heartbeat timeout, nothing hangs and
// the other worker is free again.
func TestPartitionedWorker(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"), "--heartbeat-timeout", "2s")
	s.startWorker(ctx, t, "pt-0")
	proxy := newBlackhole(t, s.addr)
	start(t, "worker pt-1", "worker", "--server", proxy.addr(), "--id", "pt-1")
	s.waitWorker(ctx, t, "pt-1", "IDLE")
	long := s.submit(ctx, t, "--model", "mlp", "--dataset", "synthetic", "--workers", "2", "--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress: %v", err)
	}
	proxy.Cut()
	cut := time.Now()
	if code := watch.wait(testCtx(t, 15*time.Second), t); code != 1 {
		t.Errorf("watch: exit %d, want 1", code)
	}
	t.Logf("job ended %.1fs after the cut", time.Since(cut).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	if sum.State != "FAILED" || !strings.Contains(sum.Message, "pt-1") {
		t.Errorf("after the cut: state %s, message %q; want FAILED naming pt-1", sum.State, sum.Message)
	}
	s.waitWorker(ctx, t, "pt-0", "IDLE")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s.waitWorker(cctx, t, "pt-1", "LOST")
}
