package rpc

import (
	"time"

	"google.golang.org/grpc"
)

// Stop stops g gracefully, giving streams up to d to drain, then
// closes what is left.
func Stop(g *grpc.Server, d time.Duration) {
	done := make(chan struct{})
	go func() { // owned by Stop: graceful stop, bounded below
		g.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.Stop()
		<-done
	}
}
