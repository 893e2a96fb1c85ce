package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// grpcurlPath finds grpcurl: $GRPCURL, else bin/grpcurl at the repository
// root (built by .ci/run from the tools module).
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GRPCURL"); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "bin", "grpcurl"))
	if err == nil {
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("grpcurl not found at bin/grpcurl or $GRPCURL; build it with: go -C tools build -o ../bin/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl")
	return ""
}

// grpcurl runs grpcurl -plaintext with args and returns its combined output
// and exit code.
func grpcurl(ctx context.Context, t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"-plaintext"}, args...)...).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
	}
	return string(out), 0
}

func TestGrpcurl(t *testing.T) {
	bin := grpcurlPath(t)
	ctx := testCtx(t, 60*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))

	out, code := grpcurl(ctx, t, bin, s.addr, "list")
	if code != 0 {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	services := strings.Fields(out)
	for _, want := range []string{"gradsync.v1.JobService", "gradsync.v1.ClusterService", "gradsync.v1.Coordinator",
		"gradsync.v1.ParameterServer", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !contains(services, want) {
			t.Errorf("list %v lacks %s", services, want)
		}
	}

	out, code = grpcurl(ctx, t, bin, s.addr, "describe", "gradsync.v1.JobService")
	if code != 0 {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
	for _, rpc := range []string{"SubmitJob", "GetJob", "ListJobs", "CancelJob", "WatchJob"} {
		if !strings.Contains(out, "rpc "+rpc+" ") {
			t.Errorf("describe lacks rpc %s:\n%s", rpc, out)
		}
	}

	out, code = grpcurl(ctx, t, bin, s.addr, "grpc.health.v1.Health/Check")
	if code != 0 || !strings.Contains(out, "SERVING") {
		t.Errorf("health check: exit %d\n%s", code, out)
	}

	// SubmitJob with a JSON body, then GetJob; a worker runs it to the end.
	s.startWorker(ctx, t, "grpcurl-w0")
	out, code = grpcurl(ctx, t, bin, "-d", `{"spec":{"model":"logreg","dataset":{"name":"synthetic"},"max_steps":5}}`,
		s.addr, "gradsync.v1.JobService/SubmitJob")
	if code != 0 {
		t.Fatalf("SubmitJob: exit %d\n%s", code, out)
	}
	var sub struct {
		Job struct{ ID, State string } `json:"job"`
	}
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub.Job.ID == "" {
		t.Fatalf("SubmitJob output %q: %v", out, err)
	}
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		out, code = grpcurl(ctx, t, bin, "-d", `{"job_id":"`+sub.Job.ID+`"}`, s.addr, "gradsync.v1.JobService/GetJob")
		if code != 0 {
			t.Fatalf("GetJob: exit %d\n%s", code, out)
		}
		if strings.Contains(out, "JOB_STATE_SUCCEEDED") {
			break
		}
		if strings.Contains(out, "JOB_STATE_FAILED") || strings.Contains(out, "JOB_STATE_CANCELLED") {
			t.Fatalf("job ended badly:\n%s", out)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job never succeeded; last GetJob:\n%s", out)
		case <-tk.C:
		}
	}

	out, code = grpcurl(ctx, t, bin, "-d", `{"job_id":"job-nope"}`, s.addr, "gradsync.v1.JobService/GetJob")
	if code == 0 || !strings.Contains(out, "Code: NotFound") {
		t.Errorf("GetJob of an unknown job: exit %d\n%s", code, out)
	}

	// Bad specs: InvalidArgument naming the field.
	bad := []struct{ name, spec, field string }{
		{"unknown model", `{"model":"gpt5"}`, "model"},
		{"batch_size -1", `{"batch_size":-1}`, "batch_size"},
		{"batch_size 0", `{"batch_size":0}`, "batch_size"},
		{"negative lr", `{"optimizer":{"lr":-0.1}}`, "optimizer.lr"},
		{"workers -1", `{"workers":-1}`, "workers"},
		{"workers 0", `{"workers":0}`, "workers"},
		{"unknown dataset", `{"dataset":{"name":"imagenet"}}`, "dataset.name"},
		{"option not implemented yet", `{"parameter_server":{"shards":2},"compression":{"type":"fp16"}}`, "parameter_server.shards"},
		{"powersgd in fedavg", `{"mode":"fedavg","compression":{"type":"powersgd"}}`, "compression.type"},
		{"checkpoint keep -1", `{"checkpoint":{"every_steps":100,"keep":-1}}`, "checkpoint.keep"},
	}
	for _, b := range bad {
		out, code := grpcurl(ctx, t, bin, "-d", `{"spec":`+b.spec+`}`, s.addr, "gradsync.v1.JobService/SubmitJob")
		if code == 0 || !strings.Contains(out, "Code: InvalidArgument") || !strings.Contains(out, b.field) {
			t.Errorf("%s: exit %d; want a non-zero exit, Code: InvalidArgument and %q in:\n%s", b.name, code, b.field, out)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
