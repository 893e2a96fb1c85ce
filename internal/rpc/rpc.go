// Package rpc holds the gRPC settings every gradsync process shares: bounded
// messages sized for tensor frames, HTTP/2 windows sized for bulk streams,
// keepalive that notices dead peers, and the interceptor chains (slog
// logging, panic recovery, refusal of unknown fields, request validation).
package rpc

import (
	"context"
	"crypto/tls"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/security"
	"github.com/gradsync/gradsync/internal/wire"
)

// ServerOptions are the options of every gradsync gRPC server, interceptors
// included. tlsCfg nil means plaintext (which the caller must have been
// asked for explicitly); auth nil means no authorisation at all (tests).
func ServerOptions(log *slog.Logger, tlsCfg *tls.Config, auth *security.AuthOptions, extra ...Option) []grpc.ServerOption {
	var o options
	for _, f := range extra {
		f(&o)
	}
	u, s := chains(log, auth, o.limiter)
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(wire.MaxMessageBytes),
		grpc.MaxSendMsgSize(wire.MaxMessageBytes),
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		u, s,
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	return opts
}

// DialOptions are the client options gradsync uses (transport credentials
// not included).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes), grpc.MaxCallSendMsgSize(wire.MaxMessageBytes)),
		grpc.WithInitialWindowSize(8 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}
}

// Interceptors returns the unary and stream interceptor chains shared by
// gradsync servers: panic recovery (a panic becomes Internal, never a
// crash), structured logging through slog, authorisation (when auth is not
// nil: refused calls are still logged, never validated), refusal of
// requests with unknown fields (RefuseUnknown) and request validation
// (messages with a Validate method).
func Interceptors(log *slog.Logger, auth *security.AuthOptions) (grpc.ServerOption, grpc.ServerOption) {
	return chains(log, auth, nil)
}

// Option adds to ServerOptions.
type Option func(*options)

type options struct{ limiter *ClientLimiter }

// WithRateLimit limits each client host's calls to the public API
// (security.DefaultPublicServices): refused calls are ResourceExhausted.
func WithRateLimit(l *ClientLimiter) Option { return func(o *options) { o.limiter = l } }

func chains(log *slog.Logger, auth *security.AuthOptions, limiter *ClientLimiter) (grpc.ServerOption, grpc.ServerOption) {
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		log.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(func(c codes.Code) logging.Level {
			switch c {
			case codes.OK, codes.Canceled, codes.NotFound, codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition:
				return logging.LevelDebug
			case codes.Internal, codes.Unknown, codes.DataLoss:
				return logging.LevelError
			}
			return logging.LevelInfo
		}),
	}
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in RPC handler", "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "internal error: %v", p)
	})
	unary := []grpc.UnaryServerInterceptor{recovery.UnaryServerInterceptor(rec), logging.UnaryServerInterceptor(logger, logOpts...)}
	stream := []grpc.StreamServerInterceptor{recovery.StreamServerInterceptor(rec), logging.StreamServerInterceptor(logger, logOpts...)}
	if limiter != nil { // before auth: guessing tokens is limited too
		lu, ls := RateLimit(limiter, security.DefaultPublicServices)
		unary, stream = append(unary, lu), append(stream, ls)
	}
	if auth != nil {
		au, as := security.Authorizer(*auth)
		unary, stream = append(unary, au), append(stream, as)
	}
	// Unknown fields before validation: a request this server cannot
	// read in full is refused as such, not for what is missing from it.
	ku, ks := RefuseUnknown()
	unary, stream = append(unary, ku), append(stream, ks)
	unary, stream = append(unary, validator.UnaryServerInterceptor()), append(stream, validator.StreamServerInterceptor())
	return grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...)
}
