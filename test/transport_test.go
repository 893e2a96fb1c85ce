package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSharedMemoryRingIsBitIdentical: ring jobs of 2 and 3 workers on
// one host, with the collectives moved to shared memory
// (--transport shm: every rank logs that it did), end with the
// parameters of the gRPC ring, bit for bit. (That no segment is left
// behind is aggregator/shmring's tests': /dev/shm is shared with the
// packages tested beside this one.)
func TestSharedMemoryRingIsBitIdentical(t *testing.T) {
	skipIfShort(t)
	for _, n := range []string{"2", "3"} {
		want := runLocal(t, "--mode", "ring", "--workers", n)
		ctx := testCtx(t, 3*time.Minute)
		p := start(t, "gradsync local", "local", "--json", "--log-level", "info", "--model", "lenet5", "--dataset", "synthetic", "--max-steps", "20", "--seed", "5",
			"--runs-dir", t.TempDir(), "--mode", "ring", "--workers", n, "--transport", "shm")
		if code := p.wait(ctx, t); code != 0 {
			t.Fatalf("%s workers over shm: exit %d", n, code)
		}
		out := p.stdout.all()
		var got pipeResult
		if len(out) == 0 || json.Unmarshal([]byte(out[len(out)-1]), &got) != nil || got.State != "SUCCEEDED" {
			t.Fatalf("%s workers over shm: output %v", n, out)
		}
		if moved := strings.Count(strings.Join(p.stderr.all(), "\n"), "collectives over shared memory"); moved != int(n[0]-'0') {
			t.Errorf("%s workers: %d rank(s) logged the move to shared memory; want every rank", n, moved)
		}
		if got.Checksum != want.Checksum || got.TestAccuracy != want.TestAccuracy {
			t.Errorf("%s workers: shm %s (accuracy %v), gRPC %s (%v); want the same", n, got.Checksum, got.TestAccuracy, want.Checksum, want.TestAccuracy)
		}
	}
}
