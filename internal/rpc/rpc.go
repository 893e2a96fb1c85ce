// Package rpc holds the gRPC settings every gradsync process shares: bounded
// messages sized for tensor frames, HTTP/2 windows sized for bulk streams,
// keepalive that notices dead peers, and the interceptor chains (slog
// logging, panic recovery, request validation).
package rpc

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/wire"
)

// ServerOptions are the options of every gradsync gRPC server, interceptors
// included.
func ServerOptions(log *slog.Logger) []grpc.ServerOption {
	u, s := Interceptors(log)
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(wire.MaxMessageBytes),
		grpc.MaxSendMsgSize(wire.MaxMessageBytes),
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		u, s,
	}
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
// gradsync servers: structured logging through slog, panic recovery (a
// panic becomes Internal, never a crash) and request validation (messages
// with a Validate method).
func Interceptors(log *slog.Logger) (grpc.ServerOption, grpc.ServerOption) {
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
	return grpc.ChainUnaryInterceptor(
			recovery.UnaryServerInterceptor(rec),
			logging.UnaryServerInterceptor(logger, logOpts...),
			validator.UnaryServerInterceptor(),
		), grpc.ChainStreamInterceptor(
			recovery.StreamServerInterceptor(rec),
			logging.StreamServerInterceptor(logger, logOpts...),
			validator.StreamServerInterceptor(),
		)
}
