package e2e

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillPipelineReplicaRecovers kills -9 a stage's worker of an elastic
// pipeline job of 2 replicas × 2 stages (min_workers 2), twice: with a
// spare worker idle, the new generation runs on 2 replicas again (the
// spare takes the lost worker's stage) from the survivors' in-memory
// snapshots and ends with the undisturbed run's parameters, bit for bit;
// with no spare, it goes on as 1 replica of the 2 stages and ends within
// 0.5 points of the undisturbed run's test accuracy. Each run's
// metrics.jsonl records the recovery, from memory.
func TestKillPipelineReplicaRecovers(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 5*time.Minute)
	dir := t.TempDir()
	runsDir := filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), runsDir)
	procs := map[string]*proc{}
	for _, id := range []string{"pr-0", "pr-1", "pr-2", "pr-3", "pr-4"} {
		// The workers write their stages' summaries into their runs directory.
		procs[id] = start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id, "--runs-dir", filepath.Join(dir, "wruns")}, s.sec...)...)
		s.waitWorker(ctx, t, id, "IDLE")
	}
	spec := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(spec, []byte("model: mlp\nmode: ring\nworkers: 4\nmin_workers: 2\nepochs: 4\nseed: 3\nlog_every_steps: 5\n"+
		"dataset: {name: synthetic}\nparallelism: {pipeline: {stages: 2, micro_batches: 2}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type result struct {
		State        string  `json:"state"`
		Message      string  `json:"message"`
		TestAccuracy float64 `json:"test_accuracy"`
		Steps        int64   `json:"steps"`
		Checksum     string  `json:"parameter_checksum"`
	}
	// run submits the job and follows it; with kill, it kills -9 one of
	// the job's workers once the job reported step 20, and returns whom.
	var lastStages []map[string]any // the undisturbed run's last progress event's stages
	run := func(kill bool) (result, string, string) {
		job := s.submit(ctx, t, "-f", spec)
		watch := start(t, "watch", "watch", job.ID, "--json", "--server", s.addr)
		victim := ""
		if kill {
			if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool {
				var ev struct {
					Event string `json:"event"`
					Step  int64  `json:"step"`
				}
				return json.Unmarshal([]byte(l), &ev) == nil && ev.Event == "progress" && ev.Step >= 20
			}); err != nil {
				t.Fatalf("no progress from the pipeline job: %v", err)
			}
			out, code := gradsync(ctx, t, "workers", "--json", "--server", s.addr)
			if code != 0 {
				t.Fatalf("gradsync workers: exit %d", code)
			}
			var busy []string
			for _, l := range out {
				var w struct {
					ID     string `json:"worker_id"`
					Job    string `json:"job_id"`
					Memory uint64 `json:"memory_bytes"`
				}
				if json.Unmarshal([]byte(l), &w) == nil && w.Job == job.ID && procs[w.ID] != nil {
					busy = append(busy, w.ID)
					if w.Memory == 0 {
						t.Errorf("gradsync workers --json: %s reports no memory (memory_bytes 0); every worker offers its host's or cgroup's", w.ID)
					}
				}
			}
			slices.Sort(busy)
			if len(busy) != 4 {
				t.Fatalf("the job's workers: %v; want 4", busy)
			}
			victim = busy[1]
			procs[victim].signal(t, syscall.SIGKILL)
			delete(procs, victim)
		}
		if code := watch.wait(ctx, t); code != 0 {
			t.Fatalf("watch of %s: exit %d", job.ID, code)
		}
		var r result
		all := watch.stdout.all()
		for _, l := range all {
			var ev struct {
				Event  string           `json:"event"`
				Stages []map[string]any `json:"stages"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Event == "progress" {
				lastStages = ev.Stages
			}
		}
		if err := json.Unmarshal([]byte(all[len(all)-1]), &r); err != nil {
			t.Fatal(err)
		}
		return r, victim, job.ID
	}
	recovery := func(job string) map[string]any {
		b, err := os.ReadFile(filepath.Join(runsDir, job, "metrics.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["kind"] == "recovered" {
				return rec
			}
		}
		return nil
	}
	want, _, _ := run(false)
	if want.State != "SUCCEEDED" {
		t.Fatalf("undisturbed run: %+v", want)
	}
	t.Logf("undisturbed: %.2f%% after %d steps, checksum %s", 100*want.TestAccuracy, want.Steps, want.Checksum)
	// watch --json shows every stage rank's figures.
	t.Logf("stages in the last progress event: %v", lastStages)
	if len(lastStages) != 4 {
		t.Errorf("the last progress event's stages: %v; want the 4 ranks' figures", lastStages)
	}
	for _, st := range lastStages {
		if st["stage"] != float64(int(st["rank"].(float64))%2) || !(st["step_seconds"].(float64) > 0) || st["peak_in_flight"] == nil {
			t.Errorf("stage figures %v", st)
		}
	}

	spare, victim, job := run(true)
	rec := recovery(job)
	t.Logf("with a spare, after kill -9 of %s: %s %.2f%% after %d steps, checksum %s; %v", victim, spare.State, 100*spare.TestAccuracy, spare.Steps, spare.Checksum, rec)
	if spare.State != "SUCCEEDED" || rec == nil || rec["lost_worker"] != victim || rec["source"] != "memory" || rec["workers"] != 4.0 {
		t.Errorf("with a spare: %+v, recovery record %v; want SUCCEEDED after recovering from the loss of %s from memory on 4 workers", spare, rec, victim)
	}
	if spare.Checksum != want.Checksum || spare.Steps != want.Steps {
		t.Errorf("with a spare: checksum %s after %d steps; undisturbed %s after %d (the same mesh from the same state must give the same bits)",
			spare.Checksum, spare.Steps, want.Checksum, want.Steps)
	}

	alone, victim, job := run(true)
	rec = recovery(job)
	t.Logf("no spare, after kill -9 of %s: %s %.2f%% after %d steps; %v", victim, alone.State, 100*alone.TestAccuracy, alone.Steps, rec)
	if alone.State != "SUCCEEDED" || rec == nil || rec["lost_worker"] != victim || rec["source"] != "memory" || rec["workers"] != 2.0 {
		t.Errorf("no spare: %+v, recovery record %v; want SUCCEEDED after recovering from the loss of %s from memory on 2 workers", alone, rec, victim)
	}
	if d := math.Abs(alone.TestAccuracy-want.TestAccuracy) * 100; d > 0.5 {
		t.Errorf("no spare: test accuracy %.2f%%, undisturbed %.2f%% (%.2f points apart; at most 0.5)", 100*alone.TestAccuracy, 100*want.TestAccuracy, d)
	}
	// The survivor the one-replica generation left out was freed: every
	// worker left is idle.
	for id := range procs {
		s.waitWorker(ctx, t, id, "IDLE")
	}
}
