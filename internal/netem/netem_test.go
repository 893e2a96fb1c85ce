package netem

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		rate float64
		str  string
	}{
		{"100Mbit", 12.5e6, "100Mbit"}, {"1gbit", 125e6, "1Gbit"}, {"10MB", 10e6, "80Mbit"},
		{"125000", 125000, "1Mbit"}, {"", 0, "unlimited"}, {"0", 0, "unlimited"}, {"64kbit", 8000, "64kbit"},
		{" 2.5 Gbit ", 2.5e9 / 8, "2.5Gbit"},
	} {
		l, err := ParseRate(c.in)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if l.Rate != c.rate || l.String() != c.str {
			t.Errorf("%q: rate %v %q, want %v %q", c.in, l.Rate, l.String(), c.rate, c.str)
		}
	}
	for _, bad := range []string{"fast", "-1Mbit", "Mbit", "1e400", "NaN"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestRate sends 400 KB over a 4 MB/s link each way and checks the
// transfer takes about 0.1 s: no faster than the rate allows (the pacing
// works), and not much slower (it does not over-throttle).
func TestRate(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	const size = 400_000
	echoed := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		_, err = io.CopyN(c, c, size) // echo back what arrives
		echoed <- err
	}()
	l := Link{Rate: 4e6}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Dial(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, size))
		sent <- err
	}()
	if _, err := io.CopyN(io.Discard, c, size); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := <-echoed; err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	// Both directions run at once (full duplex): ~size/rate = 0.1 s.
	if el < 95*time.Millisecond || el > 2*time.Second {
		t.Fatalf("400 KB each way over a 4 MB/s link took %v, want about 100 ms", el)
	}
	t.Logf("400 KB each way over 4 MB/s: %v", el)
}

// TestRateIsDelivered: a fast link (40 MB/s, a 16 KiB chunk every 0.4 ms)
// still carries about its rate although every sleep wakes late: 4 MB take
// about 100 ms, not several times that.
func TestRateIsDelivered(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	const size = 4_000_000
	got := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		_, err = io.CopyN(io.Discard, c, size)
		got <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Link{Rate: 40e6}.Dial(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("4 MB over a 40 MB/s link: %v (nominal 100 ms)", el)
	if el < 90*time.Millisecond || el > 250*time.Millisecond {
		t.Fatalf("4 MB over a 40 MB/s link took %v, want about 100 ms", el)
	}
}

func TestUnlimitedIsIdentity(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if (Link{}).Wrap(a) != a {
		t.Fatal("an unlimited link wrapped its connection")
	}
}
