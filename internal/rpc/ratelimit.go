package rpc

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// maxLimitedClients bounds the limiter table; idle entries are dropped first.
const maxLimitedClients = 10000

// ClientLimiter is a token bucket per API client host (by address, not
// token, so that guessing tokens is limited too). It implements
// go-grpc-middleware's ratelimit.Limiter.
type ClientLimiter struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex // guards clients
	clients map[string]*clientBucket
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// NewClientLimiter allows each client perSecond calls a second on average,
// in bursts of up to burst.
func NewClientLimiter(perSecond float64, burst int) *ClientLimiter {
	return &ClientLimiter{rate: rate.Limit(perSecond), burst: burst, now: time.Now, clients: map[string]*clientBucket{}}
}

// Limit refuses the call when its client's bucket is empty.
func (l *ClientLimiter) Limit(ctx context.Context) error {
	key := clientKey(ctx)
	now := l.now()
	l.mu.Lock()
	b := l.clients[key]
	if b == nil {
		if len(l.clients) >= maxLimitedClients {
			l.evictLocked(now)
		}
		b = &clientBucket{lim: rate.NewLimiter(l.rate, l.burst)}
		l.clients[key] = b
	}
	b.seen = now
	ok := b.lim.AllowN(now, 1)
	l.mu.Unlock()
	if !ok {
		return fmt.Errorf("more than %.0f calls per second (burst %d) from this client", float64(l.rate), l.burst)
	}
	return nil
}

// evictLocked drops the entries idle for longest (half the table).
func (l *ClientLimiter) evictLocked(now time.Time) {
	cut := now.Add(-time.Minute)
	for k, b := range l.clients {
		if b.seen.Before(cut) {
			delete(l.clients, k)
		}
	}
	for k := range l.clients { // still full: drop arbitrary entries
		if len(l.clients) < maxLimitedClients/2 {
			break
		}
		delete(l.clients, k)
	}
}

// clientKey names the caller by host.
func clientKey(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host, _, err := net.SplitHostPort(p.Addr.String())
		if err != nil {
			host = p.Addr.String()
		}
		return "h:" + host
	}
	return "unknown"
}

// RateLimit returns interceptors applying l to the listed services only
// (the public API; workers' streams are never limited). A refused call is
// ResourceExhausted.
func RateLimit(l *ClientLimiter, services []string) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	match := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		for _, s := range services {
			if c.Service == s || strings.HasPrefix(c.FullMethod(), "/"+s+"/") {
				return true
			}
		}
		return false
	})
	return selector.UnaryServerInterceptor(ratelimit.UnaryServerInterceptor(l), match),
		selector.StreamServerInterceptor(ratelimit.StreamServerInterceptor(l), match)
}
