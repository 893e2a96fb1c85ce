package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startAggregator starts a `gradsync aggregator` process on a free
// loopback port and returns it with its address.
func startAggregator(ctx context.Context, t *testing.T, name string) (*proc, string) {
	t.Helper()
	p := start(t, name, "aggregator", "--json", "--listen", "127.0.0.1:0")
	line, err := p.stdout.wait(ctx, p.exited, func(s string) bool { return strings.Contains(s, `"listening"`) })
	if err != nil {
		t.Fatalf("%s did not report listening: %v\nstderr:\n%s", name, err, p.stderr)
	}
	var ev struct{ Event, Address string }
	if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Address == "" {
		t.Fatalf("listening line %q: %v", line, err)
	}
	return p, ev.Address
}

// TestPSAggregatorProcesses trains a ps job whose two shards are
// `gradsync aggregator` processes, then kills one aggregator with SIGKILL
// in the middle of a long job: the job fails naming that shard, within
// the step timeout, and the workers are free again.
func TestPSAggregatorProcesses(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 120*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", dir+"/data", dir+"/runs")
	s.startWorker(ctx, t, "psa-w0")
	s.startWorker(ctx, t, "psa-w1")
	_, a0 := startAggregator(ctx, t, "aggregator 0")
	victim, a1 := startAggregator(ctx, t, "aggregator 1")
	aggs := a0 + "," + a1

	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json", "--mode", "ps", "--ps-aggregators", aggs,
		"--model", "mlp", "--dataset", "mnist", "--workers", "2", "--max-steps", "300")
	sum := parseSummary(t, out)
	if code != 0 || sum.State != "SUCCEEDED" {
		t.Fatalf("ps job on two aggregators: exit %d, %+v", code, sum)
	}
	t.Logf("mlp on MNIST, 300 steps on 2 aggregator shards: test accuracy %.4f", sum.TestAccuracy)
	if sum.TestAccuracy < 0.9 {
		t.Errorf("test accuracy %.4f after 300 steps, want ≥ 0.9", sum.TestAccuracy)
	}

	long := s.submit(ctx, t, "--mode", "ps", "--ps-aggregators", aggs, "--ps-consistency", "bounded", "--ps-staleness", "2",
		"--model", "logreg", "--dataset", "synthetic", "--workers", "2", "--epochs", "1000", "--log-every", "5", "--step-timeout", "20")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the job: %v", err)
	}
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 20*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("job ended %.1fs after the kill", time.Since(killed).Seconds())
	if sum := parseSummary(t, watch.stdout.all()); sum.State != "FAILED" || !strings.Contains(sum.Message, "shard 1 of 2 (aggregator "+a1+")") {
		t.Errorf("after kill -9 of aggregator 1: state %s, message %q; want FAILED naming shard 1 and %s", sum.State, sum.Message, a1)
	}
	s.waitWorker(ctx, t, "psa-w0", "IDLE")
	s.waitWorker(ctx, t, "psa-w1", "IDLE")
}
