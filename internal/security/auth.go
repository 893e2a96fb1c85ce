package security

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Default service classes (fully qualified gRPC service names).
var (
	// DefaultPublicServices are called by API clients with a bearer token.
	DefaultPublicServices = []string{"gradsync.v1.JobService", "gradsync.v1.ClusterService"}
	// DefaultWorkerServices are called by workers with a worker
	// certificate.
	DefaultWorkerServices = []string{"gradsync.v1.Coordinator", "gradsync.v1.ParameterServer", "gradsync.v1.Federation", "gradsync.v1.Collective", "gradsync.v1.Pipeline"}
	// DefaultOpenServices need nothing: health, and reflection (the
	// schemas are public, in the repository; reflection returns no data
	// of any job). To put reflection behind the token, list its services
	// in PublicServices and OpenServices without them.
	DefaultOpenServices = []string{
		"grpc.health.v1.Health",
		"grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection",
	}
)

// AuthOptions configure Authorizer.
type AuthOptions struct {
	// Tokens are the accepted client tokens (see LoadTokens).
	Tokens [][]byte
	// WorkerServices, PublicServices and OpenServices classify services by
	// full name ("gradsync.v1.JobService"). A nil list means the default
	// (DefaultWorkerServices, ...); an empty non-nil list means none. A
	// service in no list is refused (PermissionDenied): new services must
	// be classified before they can be called.
	WorkerServices []string
	PublicServices []string
	OpenServices   []string
	// Insecure is set when the server runs plaintext, as explicitly asked
	// for: tokens are still checked if any are configured, roles cannot
	// be (worker RPCs are allowed to anyone, public RPCs to anyone when no
	// token is configured).
	Insecure bool
}

// Validate reports configurations that refuse every public RPC: TLS (not
// Insecure) with no token. A server should fail to start on it.
func (o AuthOptions) Validate() error {
	if !o.Insecure && len(o.Tokens) == 0 {
		return errors.New("security: no client token configured: every public RPC would be refused; " +
			"give a token file or $" + TokenEnv + " (gradsync certs init writes one)")
	}
	for _, t := range o.Tokens {
		if len(t) == 0 {
			return errors.New("security: empty client token")
		}
	}
	return nil
}

// Role of an authenticated caller.
type Role string

// Roles a Principal can have.
const (
	RoleClient   Role = "client"    // presented a valid client token
	RoleWorker   Role = "worker"    // presented a verified worker certificate
	RoleAnyone   Role = "anonymous" // allowed without credentials (Insecure)
	roleNotFound Role = ""
)

// Principal is who the Authorizer let through, stored in the handler's
// context.
type Principal struct {
	Role Role
	// Name is the certificate's common name for workers, "token" for
	// clients, empty otherwise.
	Name string
}

type principalKey struct{}

// PrincipalFromContext returns the caller the Authorizer admitted. Calls
// to open services carry none.
func PrincipalFromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok && p.Role != roleNotFound
}

type class int

const (
	unclassified class = iota
	public
	workerOnly
	open
)

type authorizer struct {
	classes  map[string]class
	tokens   [][sha256.Size]byte
	insecure bool
}

// Authorizer returns server interceptors enforcing the authorisation table
// of the package documentation. Put them after recovery and logging and
// before validation, so refused calls are logged and never validated.
//
// It uses go-grpc-middleware's auth interceptor behind a selector that
// skips open services. The auth middleware's per-service
// AuthFuncOverride hook is disabled: a service cannot exempt itself.
func Authorizer(opt AuthOptions) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	a := &authorizer{classes: map[string]class{}, insecure: opt.Insecure}
	set := func(list, def []string, c class) {
		if list == nil {
			list = def
		}
		for _, s := range list {
			a.classes[s] = c
		}
	}
	// Later classes win, so a service listed twice gets the stricter one.
	set(opt.OpenServices, DefaultOpenServices, open)
	set(opt.PublicServices, DefaultPublicServices, public)
	set(opt.WorkerServices, DefaultWorkerServices, workerOnly)
	for _, t := range opt.Tokens {
		if len(t) > 0 {
			a.tokens = append(a.tokens, sha256.Sum256(t))
		}
	}

	notOpen := selector.MatchFunc(func(_ context.Context, cm interceptors.CallMeta) bool {
		return a.classes[cm.Service] != open
	})
	authU := auth.UnaryServerInterceptor(a.authorize)
	authS := auth.StreamServerInterceptor(a.authorize)
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		i := *info
		i.Server = nil // no AuthFuncOverride
		return authU(ctx, req, &i, h)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return authS(nil, ss, info, func(_ any, ss grpc.ServerStream) error { return h(srv, ss) })
	}
	return selector.UnaryServerInterceptor(unary, notOpen), selector.StreamServerInterceptor(stream, notOpen)
}

func (a *authorizer) authorize(ctx context.Context) (context.Context, error) {
	method, ok := grpc.Method(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "security: no method in context")
	}
	service := strings.TrimPrefix(method, "/")
	if i := strings.LastIndex(service, "/"); i >= 0 {
		service = service[:i]
	}
	var p Principal
	var err error
	switch a.classes[service] {
	case open:
		return ctx, nil
	case public:
		p, err = a.public(ctx, service)
	case workerOnly:
		p, err = a.worker(ctx, service)
	default:
		err = status.Errorf(codes.PermissionDenied,
			"service %s is not in the authorisation table; callable are public %v, worker %v and open services",
			service, a.list(public), a.list(workerOnly))
	}
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, principalKey{}, p), nil
}

func (a *authorizer) public(ctx context.Context, service string) (Principal, error) {
	if !a.insecure {
		if leaf := verifiedLeaf(ctx); leaf != nil && HasRole(leaf, WorkerRoleURI) {
			return Principal{}, status.Errorf(codes.PermissionDenied,
				"workers may not submit jobs: %s is the public API, for clients with a token and no worker certificate", service)
		}
	}
	if len(a.tokens) == 0 {
		if a.insecure {
			return Principal{Role: RoleAnyone}, nil
		}
		return Principal{}, status.Errorf(codes.Unauthenticated,
			"%s needs a client token, and this server has none configured", service)
	}
	tok, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil || tok == "" {
		return Principal{}, status.Errorf(codes.Unauthenticated,
			"missing bearer token: %s needs metadata \"authorization: bearer <token>\"", service)
	}
	if !a.validToken(tok) {
		return Principal{}, status.Errorf(codes.Unauthenticated, "invalid token for %s", service)
	}
	return Principal{Role: RoleClient, Name: "token"}, nil
}

func (a *authorizer) worker(ctx context.Context, service string) (Principal, error) {
	if a.insecure {
		return Principal{Role: RoleAnyone}, nil
	}
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		if tok, err := auth.AuthFromMD(ctx, "bearer"); err == nil && a.validToken(tok) {
			return Principal{}, status.Errorf(codes.PermissionDenied,
				"clients may not call worker RPCs: %s needs a worker certificate, a client token is not enough", service)
		}
		return Principal{}, status.Errorf(codes.Unauthenticated,
			"%s needs a client certificate with the worker role (%s) signed by the cluster CA", service, WorkerRoleURI)
	}
	if !HasRole(leaf, WorkerRoleURI) {
		return Principal{}, status.Errorf(codes.PermissionDenied,
			"certificate %q lacks the worker role (URI SAN %s) that %s needs", leaf.Subject.CommonName, WorkerRoleURI, service)
	}
	return Principal{Role: RoleWorker, Name: leaf.Subject.CommonName}, nil
}

// validToken compares tok against every accepted token in constant time
// (SHA-256 digests, so the token length does not leak either; no early
// exit).
func (a *authorizer) validToken(tok string) bool {
	if tok == "" {
		return false
	}
	d := sha256.Sum256([]byte(tok))
	ok := 0
	for i := range a.tokens {
		ok |= subtle.ConstantTimeCompare(d[:], a.tokens[i][:])
	}
	return ok == 1
}

func (a *authorizer) list(c class) []string {
	var out []string
	for s, k := range a.classes {
		if k == c {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// verifiedLeaf returns the caller's certificate if the TLS handshake
// verified it against the CA, else nil.
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}
