package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// HTTP limits. A scrape is one small GET; anything slower than these is a
// stuck client, not a slow one.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	gatherTimeout     = 20 * time.Second // below writeTimeout, so a slow gather gets a 503, not a cut connection
	shutdownTimeout   = 5 * time.Second
	maxScrapes        = 4 // concurrent /metrics requests; more get 503
)

// Server serves /metrics and /healthz on one listener.
type Server struct {
	ln    net.Listener
	srv   *http.Server
	log   *slog.Logger
	grace time.Duration // how long Run waits for in-flight requests
}

// Listen binds addr ("127.0.0.1:9090", ":0") for reg's metrics. The port is
// taken when Listen returns, so Addr can be printed or handed to tests
// before Run starts serving. A nil log discards messages.
func Listen(addr string, reg *Registry, log *slog.Logger) (*Server, error) {
	if reg == nil {
		return nil, errors.New("metrics: Listen: nil registry")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg.reg, promhttp.HandlerFor(reg.reg, promhttp.HandlerOpts{
		ErrorLog:            errLog,
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            reg.reg,
		MaxRequestsInFlight: maxScrapes,
		Timeout:             gatherTimeout,
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: readHeaderTimeout,
			ReadTimeout:       readTimeout,
			WriteTimeout:      writeTimeout,
			IdleTimeout:       idleTimeout,
			ErrorLog:          errLog,
		},
		log:   log,
		grace: shutdownTimeout,
	}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves until ctx ends, then shuts down, letting in-flight scrapes
// finish for up to 5 s before closing their connections. It returns nil
// once stopped, and an error only if serving failed. Run is
// called once; the listener is closed when it returns.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving metrics", "addr", s.ln.Addr().String())
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.ln) }() // stopped by Shutdown or Close below
	select {
	case err := <-served:
		return fmt.Errorf("metrics: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.grace)
	defer cancel()
	var err error
	if serr := s.srv.Shutdown(sctx); serr != nil {
		// A scrape stuck past the grace period is the client's problem;
		// cut it rather than fail the caller's shutdown.
		s.log.Warn("closing metrics connections still open after the shutdown grace period", "grace", s.grace, "err", serr)
		err = s.srv.Close()
	}
	<-served // http.ErrServerClosed
	if err != nil {
		return fmt.Errorf("metrics: close: %w", err)
	}
	return nil
}

// Serve is Listen then Run in a goroutine. It returns once listening, with
// the bound address and a wait function that blocks until the server has
// stopped after ctx ends and returns Run's error (wait may be called any
// number of times). The caller owns the goroutine: it cancels ctx and
// calls wait.
func Serve(ctx context.Context, addr string, reg *Registry, log *slog.Logger) (net.Addr, func() error, error) {
	s, err := Listen(addr, reg, log)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s.Addr(), sync.OnceValue(func() error { return <-done }), nil
}
