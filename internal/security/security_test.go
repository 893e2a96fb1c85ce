package security_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/security"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// --- a tiny gradsync server: real generated services, minimal handlers ---

type seen struct {
	mu sync.Mutex
	p  []security.Principal
}

func (s *seen) add(ctx context.Context) {
	p, _ := security.PrincipalFromContext(ctx)
	s.mu.Lock()
	s.p = append(s.p, p)
	s.mu.Unlock()
}

func (s *seen) last() (security.Principal, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.p) == 0 {
		return security.Principal{}, 0
	}
	return s.p[len(s.p)-1], len(s.p)
}

type jobs struct {
	pb.UnimplementedJobServiceServer
	s *seen
}

func (j jobs) GetJob(ctx context.Context, _ *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	j.s.add(ctx)
	return &pb.GetJobResponse{}, nil
}

func (j jobs) WatchJob(_ *pb.WatchJobRequest, st grpc.ServerStreamingServer[pb.WatchJobResponse]) error {
	j.s.add(st.Context())
	return st.Send(&pb.WatchJobResponse{})
}

type cluster struct {
	pb.UnimplementedClusterServiceServer
	s *seen
}

func (c cluster) ListWorkers(ctx context.Context, _ *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	c.s.add(ctx)
	return &pb.ListWorkersResponse{}, nil
}

type coord struct {
	pb.UnimplementedCoordinatorServer
	s *seen
}

func (c coord) Connect(st grpc.BidiStreamingServer[pb.ConnectRequest, pb.ConnectResponse]) error {
	c.s.add(st.Context())
	return nil
}

type coll struct {
	pb.UnimplementedCollectiveServer
	s *seen
}

func (c coll) SendFrames(st grpc.ClientStreamingServer[pb.SendFramesRequest, pb.SendFramesResponse]) error {
	c.s.add(st.Context())
	for {
		if _, err := st.Recv(); err == io.EOF {
			return st.SendAndClose(&pb.SendFramesResponse{})
		} else if err != nil {
			return err
		}
	}
}

// serve starts a server on 127.0.0.1 with cfg (nil: plaintext) and the
// Authorizer; it stops when the test ends.
func serve(t *testing.T, cfg *tls.Config, opt security.AuthOptions) (string, *seen) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, s := security.Authorizer(opt)
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(u), grpc.ChainStreamInterceptor(s)}
	if cfg != nil {
		opts = append(opts, grpc.Creds(security.Credentials(cfg)))
	}
	srv := grpc.NewServer(opts...)
	sn := &seen{}
	pb.RegisterJobServiceServer(srv, jobs{s: sn})
	pb.RegisterClusterServiceServer(srv, cluster{s: sn})
	pb.RegisterCoordinatorServer(srv, coord{s: sn})
	pb.RegisterCollectiveServer(srv, coll{s: sn})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String(), sn
}

// dial returns a connection with cfg (nil: plaintext) and, if token is
// set, per-RPC token credentials.
func dial(t *testing.T, addr string, cfg *tls.Config, token string) *grpc.ClientConn {
	t.Helper()
	var opts []grpc.DialOption
	if cfg != nil {
		opts = append(opts, grpc.WithTransportCredentials(security.Credentials(cfg)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(security.TokenCredentials(token, cfg != nil)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func getJob(t *testing.T, cc *grpc.ClientConn) error {
	_, err := pb.NewJobServiceClient(cc).GetJob(ctx(t), &pb.GetJobRequest{})
	return err
}

func watchJob(t *testing.T, cc *grpc.ClientConn) error {
	st, err := pb.NewJobServiceClient(cc).WatchJob(ctx(t), &pb.WatchJobRequest{})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func listWorkers(t *testing.T, cc *grpc.ClientConn) error {
	_, err := pb.NewClusterServiceClient(cc).ListWorkers(ctx(t), &pb.ListWorkersRequest{})
	return err
}

func connect(t *testing.T, cc *grpc.ClientConn) error {
	st, err := pb.NewCoordinatorClient(cc).Connect(ctx(t))
	if err != nil {
		return err
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		return err
	}
	return nil
}

func sendFrames(t *testing.T, cc *grpc.ClientConn) error {
	st, err := pb.NewCollectiveClient(cc).SendFrames(ctx(t))
	if err != nil {
		return err
	}
	if err := st.Send(&pb.SendFramesRequest{}); err != nil && err != io.EOF {
		return err
	}
	_, err = st.CloseAndRecv()
	return err
}

func healthCheck(t *testing.T, cc *grpc.ClientConn) error {
	r, err := healthpb.NewHealthClient(cc).Check(ctx(t), &healthpb.HealthCheckRequest{})
	if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health status %v", r.GetStatus())
	}
	return err
}

func reflectList(t *testing.T, cc *grpc.ClientConn) error {
	st, err := reflectpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx(t))
	if err != nil {
		return err
	}
	// A stream the server refuses at once may report io.EOF on Send; its
	// status comes from Recv.
	if err := st.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	r, err := st.Recv()
	if err != nil {
		return err
	}
	_ = st.CloseSend()
	if len(r.GetListServicesResponse().GetService()) < 5 {
		t.Errorf("reflection listed %v", r.GetListServicesResponse().GetService())
	}
	return nil
}

func wantCode(t *testing.T, what string, err error, want codes.Code, msg string) {
	t.Helper()
	got := status.Code(err)
	if got == codes.Unavailable {
		t.Logf("%s: %v", what, err)
	}
	if got != want {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, want)
		return
	}
	if msg != "" && !strings.Contains(status.Convert(err).Message(), msg) {
		t.Errorf("%s: message %q does not contain %q", what, status.Convert(err).Message(), msg)
	}
}

// --- fixtures: a PKI on disk, loaded through the file APIs ---

type fixture struct {
	paths   security.Paths
	token   string
	tokens  [][]byte
	server  *tls.Config // ServerTLS
	peer    *tls.Config // PeerServerTLS (worker certificate)
	api     *tls.Config // ClientTLS, no certificate
	worker  *tls.Config // ClientTLS with the worker certificate
	wpeer   *tls.Config // PeerClientTLS
	asOther *tls.Config // ClientTLS presenting the server certificate (no worker role)
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	p, err := security.InitCerts(filepath.Join(t.TempDir(), "pki"), security.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{paths: p}
	if f.tokens, err = security.LoadTokens(p.Token, ""); err != nil || len(f.tokens) != 1 {
		t.Fatalf("LoadTokens: %v %d", err, len(f.tokens))
	}
	f.token = string(f.tokens[0])
	must := func(c *tls.Config, err error) *tls.Config {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	f.server = must(security.ServerTLS(p.ServerCert, p.ServerKey, p.CA))
	f.peer = must(security.PeerServerTLS(p.WorkerCert, p.WorkerKey, p.CA))
	f.api = must(security.ClientTLS(p.CA, "", ""))
	f.worker = must(security.ClientTLS(p.CA, p.WorkerCert, p.WorkerKey))
	f.wpeer = must(security.PeerClientTLS(p.CA, p.WorkerCert, p.WorkerKey))
	f.asOther = must(security.ClientTLS(p.CA, p.ServerCert, p.ServerKey))
	return f
}

func TestAuthorisationMatrix(t *testing.T) {
	f := newFixture(t)
	opt := security.AuthOptions{Tokens: f.tokens}
	if err := opt.Validate(); err != nil {
		t.Fatal(err)
	}
	addr, sn := serve(t, f.server, opt)

	anon := dial(t, addr, f.api, "")
	client := dial(t, addr, f.api, f.token)
	wrong := dial(t, addr, f.api, "not-the-token-0123456789")
	worker := dial(t, addr, f.worker, "")
	workerTok := dial(t, addr, f.worker, f.token)
	other := dial(t, addr, f.asOther, "")

	// Public services.
	wantCode(t, "no token GetJob", getJob(t, anon), codes.Unauthenticated, "missing bearer token")
	wantCode(t, "no token WatchJob", watchJob(t, anon), codes.Unauthenticated, "missing bearer token")
	wantCode(t, "no token ListWorkers", listWorkers(t, anon), codes.Unauthenticated, "missing bearer token")
	wantCode(t, "wrong token GetJob", getJob(t, wrong), codes.Unauthenticated, "invalid token")
	wantCode(t, "wrong token WatchJob", watchJob(t, wrong), codes.Unauthenticated, "invalid token")
	_, n0 := sn.last()
	wantCode(t, "token GetJob", getJob(t, client), codes.OK, "")
	if p, n := sn.last(); n != n0+1 || p.Role != security.RoleClient {
		t.Errorf("principal %+v after %d calls", p, n)
	}
	wantCode(t, "token WatchJob", watchJob(t, client), codes.OK, "")
	wantCode(t, "token ListWorkers", listWorkers(t, client), codes.OK, "")
	wantCode(t, "worker cert GetJob", getJob(t, worker), codes.PermissionDenied, "workers may not submit jobs")
	wantCode(t, "worker cert+token GetJob", getJob(t, workerTok), codes.PermissionDenied, "workers may not submit jobs")
	wantCode(t, "worker cert WatchJob", watchJob(t, worker), codes.PermissionDenied, "workers may not submit jobs")
	wantCode(t, "worker cert ListWorkers", listWorkers(t, worker), codes.PermissionDenied, "workers may not submit jobs")
	wantCode(t, "other cert GetJob", getJob(t, other), codes.Unauthenticated, "missing bearer token")

	// Worker services.
	wantCode(t, "no creds Connect", connect(t, anon), codes.Unauthenticated, "worker role")
	wantCode(t, "token Connect", connect(t, client), codes.PermissionDenied, "clients may not call worker RPCs")
	wantCode(t, "wrong token Connect", connect(t, wrong), codes.Unauthenticated, "worker role")
	wantCode(t, "other cert Connect", connect(t, other), codes.PermissionDenied, "lacks the worker role")
	wantCode(t, "token SendFrames", sendFrames(t, client), codes.PermissionDenied, "clients may not call worker RPCs")
	_, n0 = sn.last()
	wantCode(t, "worker cert Connect", connect(t, worker), codes.OK, "")
	if p, n := sn.last(); n != n0+1 || p.Role != security.RoleWorker || p.Name != "gradsync worker" {
		t.Errorf("principal %+v after %d calls", p, n)
	}
	wantCode(t, "worker cert+token Connect", connect(t, workerTok), codes.OK, "")
	wantCode(t, "worker cert SendFrames", sendFrames(t, worker), codes.OK, "")

	// Open services.
	for name, cc := range map[string]*grpc.ClientConn{"anon": anon, "client": client, "wrong": wrong, "worker": worker, "other": other} {
		wantCode(t, name+" health", healthCheck(t, cc), codes.OK, "")
		wantCode(t, name+" reflection", reflectList(t, cc), codes.OK, "")
	}
}

func TestForeignCARejected(t *testing.T) {
	f := newFixture(t)
	foreign, err := security.EphemeralPKI([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	addr, sn := serve(t, f.server, security.AuthOptions{Tokens: f.tokens})

	// A worker certificate from another CA: the server refuses the handshake.
	c := foreign.WorkerClientTLS()
	c.RootCAs = f.worker.RootCAs // trusts our server, presents a foreign cert
	cc := dial(t, addr, c, "")
	wantCode(t, "foreign worker cert Connect", connect(t, cc), codes.Unavailable, "")
	wantCode(t, "foreign worker cert health", healthCheck(t, cc), codes.Unavailable, "")

	// A client trusting another CA does not accept our server.
	cc2 := dial(t, addr, foreign.ClientTLS(), f.token)
	wantCode(t, "client with foreign CA", getJob(t, cc2), codes.Unavailable, "")
	if _, n := sn.last(); n != 0 {
		t.Errorf("%d handlers ran", n)
	}
}

func TestPeerEndpointRequiresCertificate(t *testing.T) {
	f := newFixture(t)
	foreign, err := security.EphemeralPKI(nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, sn := serve(t, f.peer, security.AuthOptions{Tokens: f.tokens})

	// No certificate: the handshake fails, even for health and with a token.
	wantCode(t, "no cert SendFrames", sendFrames(t, dial(t, addr, f.api, f.token)), codes.Unavailable, "")
	wantCode(t, "no cert health", healthCheck(t, dial(t, addr, f.api, "")), codes.Unavailable, "")
	// Foreign certificate: same.
	fc := foreign.WorkerClientTLS()
	fc.RootCAs = f.api.RootCAs
	wantCode(t, "foreign cert SendFrames", sendFrames(t, dial(t, addr, fc, "")), codes.Unavailable, "")
	// A worker of this cluster, verified by chain and role.
	wantCode(t, "peer SendFrames", sendFrames(t, dial(t, addr, f.wpeer, "")), codes.OK, "")
	if p, _ := sn.last(); p.Role != security.RoleWorker {
		t.Errorf("principal %+v", p)
	}
	// A worker peer client does not accept a peer serving a non-worker cert.
	saddr, _ := serve(t, f.server, security.AuthOptions{Tokens: f.tokens})
	wantCode(t, "peer client vs server cert", sendFrames(t, dial(t, saddr, f.wpeer, "")), codes.Unavailable, "")
	// ... nor one from a foreign CA.
	faddr, _ := serve(t, foreign.WorkerServerTLS(), security.AuthOptions{Tokens: foreign.Tokens()})
	wantCode(t, "peer client vs foreign peer", sendFrames(t, dial(t, faddr, f.wpeer, "")), codes.Unavailable, "")
}

func TestEphemeralPKI(t *testing.T) {
	k, err := security.EphemeralPKI(nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, k.ServerTLS(), security.AuthOptions{Tokens: k.Tokens()})
	wantCode(t, "token GetJob", getJob(t, dial(t, addr, k.ClientTLS(), k.Token)), codes.OK, "")
	wantCode(t, "worker Connect", connect(t, dial(t, addr, k.WorkerClientTLS(), "")), codes.OK, "")
	wantCode(t, "worker GetJob", getJob(t, dial(t, addr, k.WorkerClientTLS(), k.Token)), codes.PermissionDenied, "")
	paddr, _ := serve(t, k.WorkerServerTLS(), security.AuthOptions{Tokens: k.Tokens()})
	wantCode(t, "peer SendFrames", sendFrames(t, dial(t, paddr, k.PeerClientTLS(), "")), codes.OK, "")
	wantCode(t, "no cert peer", sendFrames(t, dial(t, paddr, k.ClientTLS(), "")), codes.Unavailable, "")
}

func TestInsecureMode(t *testing.T) {
	const tok = "plaintext-token-0123456789"
	addr, _ := serve(t, nil, security.AuthOptions{Tokens: [][]byte{[]byte(tok)}, Insecure: true})
	anon := dial(t, addr, nil, "")
	wantCode(t, "no token GetJob", getJob(t, anon), codes.Unauthenticated, "missing bearer token")
	wantCode(t, "wrong token GetJob", getJob(t, dial(t, addr, nil, "wrong-token-0123456789")), codes.Unauthenticated, "invalid token")
	wantCode(t, "token GetJob", getJob(t, dial(t, addr, nil, tok)), codes.OK, "")
	wantCode(t, "Connect (roles unchecked)", connect(t, anon), codes.OK, "")
	wantCode(t, "health", healthCheck(t, anon), codes.OK, "")

	addr2, _ := serve(t, nil, security.AuthOptions{Insecure: true})
	wantCode(t, "no tokens configured GetJob", getJob(t, dial(t, addr2, nil, "")), codes.OK, "")

	// Without Insecure, a plaintext server grants no worker role.
	addr3, _ := serve(t, nil, security.AuthOptions{Tokens: [][]byte{[]byte(tok)}})
	wantCode(t, "plaintext Connect not insecure", connect(t, dial(t, addr3, nil, "")), codes.Unauthenticated, "")

	// A token that requires TLS is not sent over plaintext.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(security.TokenCredentials(tok, true)))
	if err == nil {
		defer cc.Close()
		if err := getJob(t, cc); err == nil {
			t.Error("token requiring TLS was sent over plaintext")
		}
	}
}

func TestFailClosed(t *testing.T) {
	f := newFixture(t)
	// Health taken out of every list: refused, not open.
	addr, _ := serve(t, f.server, security.AuthOptions{Tokens: f.tokens, OpenServices: []string{}})
	wantCode(t, "unclassified health", healthCheck(t, dial(t, addr, f.api, f.token)), codes.PermissionDenied, "not in the authorisation table")
	// TLS without tokens refuses public RPCs, and Validate says so.
	opt := security.AuthOptions{}
	if opt.Validate() == nil {
		t.Error("Validate accepted TLS without tokens")
	}
	addr2, _ := serve(t, f.server, opt)
	wantCode(t, "no tokens configured", getJob(t, dial(t, addr2, f.api, "anything-0123456789")), codes.Unauthenticated, "none configured")
	// Reflection behind the token when asked for.
	addr3, _ := serve(t, f.server, security.AuthOptions{
		Tokens:         f.tokens,
		OpenServices:   []string{"grpc.health.v1.Health"},
		PublicServices: append([]string{"grpc.reflection.v1.ServerReflection"}, security.DefaultPublicServices...),
	})
	wantCode(t, "gated reflection, no token", reflectList(t, dial(t, addr3, f.api, "")), codes.Unauthenticated, "")
	wantCode(t, "gated reflection, token", reflectList(t, dial(t, addr3, f.api, f.token)), codes.OK, "")
	wantCode(t, "gated reflection, health", healthCheck(t, dial(t, addr3, f.api, "")), codes.OK, "")
}
