package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client never keeps connections, so no transport goroutine outlives a
// test.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// scrape fetches /metrics and returns its samples keyed by
// `name{label="value",...}` exactly as exposed (labels sorted by name).
func scrape(t *testing.T, addr net.Addr) map[string]float64 {
	t.Helper()
	resp, err := client.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return samples
}

func want(t *testing.T, samples map[string]float64, key string, v float64) {
	t.Helper()
	got, ok := samples[key]
	if !ok {
		t.Errorf("no sample %s", key)
		return
	}
	if got != v {
		t.Errorf("%s = %v, want %v", key, got, v)
	}
}

func TestServe(t *testing.T) {
	reg := NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, wait, err := Serve(ctx, "127.0.0.1:0", reg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	s := scrape(t, addr)
	for _, st := range JobStates {
		want(t, s, `gradsync_jobs{state="`+st+`"}`, 0)
	}
	for _, key := range []string{
		"gradsync_step_duration_seconds_count",
		`gradsync_step_duration_seconds_bucket{le="+Inf"}`,
		"gradsync_heartbeats_missed_total",
		"gradsync_recoveries_total",
		"gradsync_nonfinite_steps_skipped_total",
	} {
		want(t, s, key, 0)
	}
	for _, key := range []string{"go_goroutines", "process_resident_memory_bytes", "process_open_fds"} {
		if s[key] <= 0 {
			t.Errorf("%s = %v, want > 0", key, s[key])
		}
	}

	reg.SetJobCounts(map[string]int{"RUNNING": 2, "PENDING": 1, "PREEMPTED": 1})
	reg.SetJobCounts(map[string]int{"RUNNING": 3, "SUCCEEDED": 4})
	reg.ObserveStep(30 * time.Millisecond)
	reg.ObserveStep(90 * time.Millisecond)
	reg.SetImagesPerSecond("job-1", 0, 4000)
	reg.SetImagesPerSecond("job-1", 1, 4100)
	reg.SetImagesPerSecond("job-2", 0, 10)
	reg.AddBytesSent("job-1", "worker-b", 1000)
	reg.AddBytesSent("job-1", "worker-b", 24)
	reg.AddBytesSent("job-1", "worker-b", -5) // ignored, not a panic
	reg.AddBytesReceived("job-1", "worker-c", 512)
	reg.ObserveCompression("job-1", CompressionTotals{RawBytes: 4000, SentBytes: 1000, Seconds: 0.5})
	reg.ObserveCompression("job-1", CompressionTotals{RawBytes: 8000, SentBytes: 2000, Seconds: 0.75})
	reg.ObserveCollective("all_reduce", 2*time.Millisecond)
	reg.ObserveCollective("all_reduce", 3*time.Millisecond)
	reg.ObserveCollective("broadcast", time.Millisecond)
	reg.HeartbeatMissed()
	reg.HeartbeatMissed()
	reg.Recovered()
	reg.NonFiniteStepSkipped()
	reg.SetStragglerDelay("job-1", 2, 0.2)
	reg.StragglerFound()

	s = scrape(t, addr)
	want(t, s, `gradsync_jobs{state="RUNNING"}`, 3)
	want(t, s, `gradsync_jobs{state="SUCCEEDED"}`, 4)
	want(t, s, `gradsync_jobs{state="PENDING"}`, 0)   // dropped out of the counts
	want(t, s, `gradsync_jobs{state="PREEMPTED"}`, 0) // unknown states are kept, at zero
	want(t, s, "gradsync_step_duration_seconds_count", 2)
	want(t, s, "gradsync_step_duration_seconds_sum", 0.12)
	want(t, s, `gradsync_step_duration_seconds_bucket{le="0.064"}`, 1)
	want(t, s, `gradsync_images_per_second{job="job-1",rank="0"}`, 4000)
	want(t, s, `gradsync_images_per_second{job="job-1",rank="1"}`, 4100)
	want(t, s, `gradsync_peer_sent_bytes_total{job="job-1",peer="worker-b"}`, 1024)
	want(t, s, `gradsync_peer_received_bytes_total{job="job-1",peer="worker-c"}`, 512)
	want(t, s, `gradsync_compression_ratio{job="job-1"}`, 4)
	want(t, s, `gradsync_gradient_raw_bytes_total{job="job-1"}`, 8000)
	want(t, s, `gradsync_gradient_sent_bytes_total{job="job-1"}`, 2000)
	want(t, s, `gradsync_compress_seconds_total{job="job-1"}`, 0.75)
	want(t, s, `gradsync_collective_duration_seconds_count{op="all_reduce"}`, 2)
	want(t, s, `gradsync_collective_duration_seconds_count{op="broadcast"}`, 1)
	want(t, s, "gradsync_heartbeats_missed_total", 2)
	want(t, s, "gradsync_recoveries_total", 1)
	want(t, s, "gradsync_nonfinite_steps_skipped_total", 1)
	want(t, s, `gradsync_straggler_delay_seconds{job="job-1",rank="2"}`, 0.2)
	want(t, s, "gradsync_stragglers_total", 1)
	want(t, s, `promhttp_metric_handler_requests_total{code="200"}`, 1)

	reg.ForgetJob("job-1")
	s = scrape(t, addr)
	for key := range s {
		if strings.Contains(key, `job="job-1"`) {
			t.Errorf("%s still exported after ForgetJob", key)
		}
	}
	want(t, s, `gradsync_images_per_second{job="job-2",rank="0"}`, 10)

	// /healthz answers; other methods and paths do not serve metrics.
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
	}{
		{http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{http.MethodHead, "/healthz", http.StatusOK, ""},
		{http.MethodPost, "/metrics", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/", http.StatusNotFound, ""},
	} {
		req, err := http.NewRequest(tc.method, "http://"+addr.String()+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || (tc.body != "" && string(body) != tc.body) {
			t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, body, tc.code, tc.body)
		}
	}

	cancel()
	if err := wait(); err != nil {
		t.Errorf("wait = %v", err)
	}
	if err := wait(); err != nil {
		t.Errorf("second wait = %v", err)
	}
	if _, err := client.Get("http://" + addr.String() + "/healthz"); err == nil {
		t.Error("server still answers after ctx ended")
	}
}

// TestRunStopsWithOpenConnection: a client that holds a connection in
// the middle of a request does not keep Run from returning.
func TestRunStopsWithOpenConnection(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.grace = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	conn, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Half a request: the connection is active, not idle.
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestListenErrors(t *testing.T) {
	if _, err := Listen("127.0.0.1:0", nil, nil); err == nil {
		t.Error("Listen with nil registry succeeded")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, _, err := Serve(context.Background(), ln.Addr().String(), NewRegistry(), nil); err == nil {
		t.Error("Serve on a port in use succeeded")
	}
}

// TestGRPC checks the interceptors against a real gRPC server on bufconn:
// a unary call and a server stream of the standard health service.
func TestGRPC(t *testing.T) {
	reg := NewRegistry()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(reg.GRPCServerOptions()...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reg.InitializeGRPC(gs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	defer func() {
		gs.Stop()
		<-served
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Before any call, InitializeGRPC has exported the methods at zero.
	s := gather(t, reg)
	want(t, s, `grpc_server_started_total{grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"}`, 0)

	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); err == nil {
		t.Fatal("Check of an unknown service succeeded")
	}
	wctx, wcancel := context.WithCancel(ctx)
	stream, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	wcancel()
	for { // wait for the server to see the cancelled stream
		s = gather(t, reg)
		if s[`grpc_server_handled_total{grpc_code="Canceled",grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"}`] == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("Watch never reported as handled")
		}
		time.Sleep(10 * time.Millisecond)
	}

	const check = `grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"`
	want(t, s, `grpc_server_started_total{`+check+`}`, 2)
	want(t, s, `grpc_server_handled_total{grpc_code="OK",`+check+`}`, 1)
	want(t, s, `grpc_server_handled_total{grpc_code="NotFound",`+check+`}`, 1)
	want(t, s, `grpc_server_handling_seconds_count{`+check+`}`, 2)
	want(t, s, `grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"}`, 1)
}

// gather scrapes reg through a short-lived server of its own.
func gather(t *testing.T, reg *Registry) map[string]float64 {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ln.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	return scrape(t, ln.Addr())
}

func TestNilRegistry(t *testing.T) {
	var r *Registry
	r.SetJobCounts(map[string]int{"RUNNING": 1})
	r.ObserveStep(time.Second)
	r.SetImagesPerSecond("j", 0, 1)
	r.AddBytesSent("j", "p", 1)
	r.AddBytesReceived("j", "p", 1)
	r.ObserveCompression("j", CompressionTotals{RawBytes: 2, SentBytes: 1})
	r.ObserveCollective("all_reduce", time.Second)
	r.HeartbeatMissed()
	r.Recovered()
	r.NonFiniteStepSkipped()
	r.ForgetJob("j")
	r.InitializeGRPC(nil)
	if r.Prometheus() != nil || r.GRPCServerOptions() != nil {
		t.Error("nil registry has a registry or options")
	}
	called := false
	if _, err := r.UnaryServerInterceptor()(context.Background(), nil, nil, func(context.Context, any) (any, error) {
		called = true
		return nil, nil
	}); err != nil || !called {
		t.Errorf("nil unary interceptor: called=%v err=%v", called, err)
	}
	wantErr := errors.New("handler")
	if err := r.StreamServerInterceptor()(nil, nil, nil, func(any, grpc.ServerStream) error { return wantErr }); err != wantErr {
		t.Errorf("nil stream interceptor = %v", err)
	}
}
