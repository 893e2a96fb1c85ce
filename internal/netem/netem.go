// Package netem emulates a slower network link on top of a real
// connection: a connection wrapped by a Link carries at most Rate bytes per
// second in each direction (full duplex, like a switched Ethernet port),
// paced in small chunks. It is for experiments (when does gradient
// compression pay?) and tests, not for production traffic shaping: Linux's
// tc on a veth pair does the same in the kernel, but needs root and network
// namespaces; this works anywhere, in one process or many.
//
// A Link shapes what its process sends and receives on the connections it
// dials; use it on every process of a job (every ring rank dials its right
// neighbour, and every worker dials the coordinator) so that each host's
// traffic crosses one emulated port each way.
package netem

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// chunk bounds one paced write or read, so that pacing stays smooth and a
// wait is short (16 KiB at 100 Mbit/s is 1.3 ms).
const chunk = 16 << 10

// Link is an emulated link: Rate bytes per second in each direction.
type Link struct {
	Rate float64 // bytes per second; ≤ 0 means unlimited
}

// ParseRate reads a link rate such as "100Mbit", "1Gbit", "10MB" (bytes),
// "125000" (bytes per second) or "" / "0" (unlimited). Units follow tc:
// kbit, mbit, gbit are 10³, 10⁶, 10⁹ bits per second; kb, mb, gb are
// 10³… bytes per second (case-insensitive).
func ParseRate(s string) (Link, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return Link{}, nil
	}
	units := []struct {
		suffix string
		bytes  float64
	}{
		{"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"bit", 1.0 / 8},
		{"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"b", 1},
	}
	mul := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mul = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.bytes
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v != v || v > 1e15 {
		return Link{}, fmt.Errorf("link rate %q: want a number with an optional unit (e.g. 100Mbit, 1Gbit, 10MB)", s)
	}
	return Link{Rate: v * mul}, nil
}

// String is the rate in tc's notation ("unlimited" for none).
func (l Link) String() string {
	switch bits := l.Rate * 8; {
	case l.Rate <= 0:
		return "unlimited"
	case bits >= 1e9:
		return strconv.FormatFloat(bits/1e9, 'g', 4, 64) + "Gbit"
	case bits >= 1e6:
		return strconv.FormatFloat(bits/1e6, 'g', 4, 64) + "Mbit"
	default:
		return strconv.FormatFloat(bits/1e3, 'g', 4, 64) + "kbit"
	}
}

// Unlimited reports whether the link does not shape at all.
func (l Link) Unlimited() bool { return l.Rate <= 0 }

// Dial connects to addr over TCP and shapes the connection (for
// grpc.WithContextDialer).
func (l Link) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return l.Wrap(c), nil
}

// Wrap shapes c; an unlimited link returns c itself.
func (l Link) Wrap(c net.Conn) net.Conn {
	if l.Unlimited() {
		return c
	}
	return &conn{Conn: c, out: pacer{rate: l.Rate}, in: pacer{rate: l.Rate}}
}

// burst is how far behind the clock the link's schedule may fall before
// it is reset to now: time.Sleep wakes late (by tens of microseconds to a
// millisecond, more under load), and without this credit every late
// wake-up would be lost link time — a 1 Gbit/s link paced in 16 KiB
// chunks delivered a quarter of its rate. The cost: after an idle moment
// up to burst·rate bytes (250 KB at 1 Gbit/s) go out at once, as from a
// token bucket of that depth (tc's tbf has the same knob).
const burst = 2 * time.Millisecond

// pacer spaces transfers so that they average rate bytes per second: each
// transfer of n bytes occupies the link for n/rate seconds after the
// previous one ends (a token bucket of depth burst).
type pacer struct {
	mu   sync.Mutex
	rate float64
	free time.Time // when the link is next free
}

// wait reserves the link for n bytes and sleeps until that reservation
// ends. Sleeping is the point here: the emulated link is busy.
func (p *pacer) wait(n int) {
	p.mu.Lock()
	now := time.Now()
	start := p.free
	if floor := now.Add(-burst); start.Before(floor) {
		start = floor
	}
	p.free = start.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	until := p.free
	p.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
}

type conn struct {
	net.Conn
	out, in pacer
}

// Write sends b in chunks, each after the link has carried the previous.
func (c *conn) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n := min(len(b)-done, chunk)
		c.out.wait(n)
		m, err := c.Conn.Write(b[done : done+n])
		done += m
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// Read receives at most one chunk and holds it for the time the link
// takes to carry it.
func (c *conn) Read(b []byte) (int, error) {
	if len(b) > chunk {
		b = b[:chunk]
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.in.wait(n)
	}
	return n, err
}
