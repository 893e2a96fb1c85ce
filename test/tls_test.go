package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/security"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestTLS runs a whole job with TLS everywhere (gradsync certs init, mTLS
// between server and workers and between peers, a bearer token for the
// API) and checks who may call what.
func TestTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Setenv(security.TokenEnv, "")
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if out, code := gradsync(ctx, t, "certs", "init", "--dir", certs, "--json"); code != 0 {
		t.Fatalf("certs init: exit %d %v", code, out)
	}
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"), "--certs", certs)
	// The certificate names localhost; reach the server by that name.
	s.addr = strings.Replace(s.addr, "127.0.0.1", "localhost", 1)
	s.startWorker(ctx, t, "tls-0")
	s.startWorker(ctx, t, "tls-1")

	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--certs", certs, "--watch", "--json",
		"--model", "logreg", "--dataset", "synthetic", "--workers", "2", "--max-steps", "50")
	if code != 0 || len(out) == 0 {
		t.Fatalf("submit over TLS: exit %d, output %v", code, out)
	}
	var sum summary
	if err := json.Unmarshal([]byte(out[len(out)-1]), &sum); err != nil || sum.State != "SUCCEEDED" {
		t.Fatalf("summary %q: %v", out[len(out)-1], err)
	}

	// A client with the CA but no token: Unauthenticated.
	noTok := filepath.Join(dir, "notoken")
	if err := os.MkdirAll(noTok, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(certs, security.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noTok, security.CAFile), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"no token":    {"jobs", "--server", s.addr, "--certs", noTok},
		"wrong token": {"jobs", "--server", s.addr, "--certs", certs, "--token", "not-the-token-at-all"},
	} {
		p := start(t, name, args...)
		if code := p.wait(ctx, t); code == 0 || !strings.Contains(p.stderr.String(), "Unauthenticated") {
			t.Errorf("%s: exit %d, stderr %q; want Unauthenticated", name, code, p.stderr.String())
		}
	}

	// A worker certificate calling SubmitJob: PermissionDenied.
	token, err := os.ReadFile(filepath.Join(certs, security.TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	workerTLS, err := security.ClientTLS(filepath.Join(certs, security.CAFile), filepath.Join(certs, security.WorkerCertFile), filepath.Join(certs, security.WorkerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(workerTLS)),
		grpc.WithPerRPCCredentials(security.TokenCredentials(strings.TrimSpace(string(token)), true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewJobServiceClient(conn).SubmitJob(ctx, &pb.SubmitJobRequest{Spec: &pb.JobSpec{}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker certificate calling SubmitJob: %v; want PermissionDenied", err)
	}

	// A client without a certificate cannot connect to a worker's peer
	// endpoint, not even for health.
	var addr string
	wout, code := gradsync(ctx, t, "workers", "--json", "--server", s.addr, "--certs", certs)
	for _, l := range wout {
		var w struct {
			ID      string `json:"worker_id"`
			Address string
		}
		if json.Unmarshal([]byte(l), &w) == nil && w.ID == "tls-0" {
			addr = w.Address
		}
	}
	if code != 0 || addr == "" {
		t.Fatalf("no address for worker tls-0 in %v", wout)
	}
	clientTLS, err := security.ClientTLS(filepath.Join(certs, security.CAFile), "", "")
	if err != nil {
		t.Fatal(err)
	}
	clientTLS.ServerName = "localhost"
	pconn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(pconn).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a client without a certificate reached a worker's peer endpoint")
	}
}
