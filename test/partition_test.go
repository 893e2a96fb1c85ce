package e2e

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
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

// freePort returns a loopback address no one listens on right now.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestPartitionedRingLink cuts the ring link into one worker of an
// elastic ring job (its peer endpoint is reached through a blackhole
// proxy; its coordinator link and heartbeats stay up): the step timeout
// stops the ring, the ranks' frame counts show which link lost frames,
// and the coordinator evicts that worker — not its neighbour — and the job
// recovers on the other two and succeeds without it.
func TestPartitionedRingLink(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 120*time.Second)
	dir := t.TempDir()
	runsDir := filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), runsDir)
	s.startWorker(ctx, t, "rc-0")
	listen := freePort(t)
	proxy := newBlackhole(t, listen)
	start(t, "worker rc-1", "worker", "--server", s.addr, "--id", "rc-1", "--addr", listen, "--advertise", proxy.addr())
	s.waitWorker(ctx, t, "rc-1", "IDLE")
	s.startWorker(ctx, t, "rc-2")
	spec := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(spec, []byte("model: mlp\nmode: ring\nworkers: 3\nmin_workers: 2\nepochs: 30\nstep_timeout_seconds: 2\n"+
		"log_every_steps: 5\ndataset: {name: synthetic}\ncheckpoint: {every_steps: 20}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	job := s.submit(ctx, t, "-f", spec)
	watch := start(t, "watch", "watch", job.ID, "--json", "--server", s.addr)
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		if es, _ := os.ReadDir(filepath.Join(runsDir, job.ID, "checkpoints")); len(es) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no checkpoint written")
		case <-tk.C:
		}
	}
	proxy.Cut()
	cut := time.Now()
	line, err := watch.stdout.wait(testCtx(t, 20*time.Second), watch.exited, func(l string) bool {
		return strings.Contains(l, `"event":"log"`) && strings.Contains(l, "cut off from the ring")
	})
	if err != nil {
		t.Fatalf("no eviction within 20s of the cut: %v", err)
	}
	t.Logf("evicted %.1fs after the cut: %s", time.Since(cut).Seconds(), line)
	if !strings.Contains(line, "worker rc-1 ") {
		t.Errorf("eviction %s does not name rc-1, the worker cut off", line)
	}
	if code := watch.wait(ctx, t); code != 0 {
		t.Fatalf("watch: exit %d", code)
	}
	if sum := parseSummary(t, watch.stdout.all()); sum.State != "SUCCEEDED" {
		t.Fatalf("after the cut: %+v; want SUCCEEDED on the other two workers", sum)
	}
	if got := s.jobs(ctx, t)[job.ID].WorkerIDs; len(got) != 2 || slices.Contains(got, "rc-1") {
		t.Errorf("final workers %v; want the two others", got)
	}
	s.waitWorker(ctx, t, "rc-1", "IDLE") // evicted from the job, still connected
}
