package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/peer"
)

func TestClientLimiter(t *testing.T) {
	l := NewClientLimiter(1, 3)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	a := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}})
	b := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 1}})
	for i := range 3 {
		if err := l.Limit(a); err != nil {
			t.Fatalf("call %d within the burst refused: %v", i, err)
		}
	}
	if err := l.Limit(a); err == nil {
		t.Fatal("call past the burst allowed")
	}
	if err := l.Limit(b); err != nil {
		t.Fatalf("another client limited by the first one's calls: %v", err)
	}
	now = now.Add(time.Second)
	if err := l.Limit(a); err != nil {
		t.Fatalf("refill after a second refused: %v", err)
	}
	// Without a token, callers are told apart by host, not port.
	h1 := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}})
	h2 := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 2}})
	if clientKey(h1) != clientKey(h2) {
		t.Error("two ports of one host are different clients")
	}
}
