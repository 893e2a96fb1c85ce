//go:build linux

package shmring_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/peertest"
	"github.com/gradsync/gradsync/aggregator/ringtest"
	"github.com/gradsync/gradsync/aggregator/shmring"
)

var secret = []byte("0123456789abcdef-job-secret")

// segDir is a fresh segment directory on tmpfs (/dev/shm) where there is
// one, so that the tests exercise what production uses.
func segDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp(shmring.DefaultDir, "shmring-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

var entries = shmring.Entries

// connect sets up an n-rank ring in this process, ranks as goroutines, as
// the negotiation will across processes: every rank creates its segment,
// then each connects with its left neighbour's offer. cfg adjusts rank
// i's Config. It returns the rings (nil where Connect failed) and errors.
func connect(t testing.TB, dir string, n int, cfg func(c *shmring.Config)) ([]*shmring.Ring, []error) {
	t.Helper()
	ps := make([]*shmring.Pending, n)
	offers := make([]shmring.Offer, n)
	for i := range n {
		c := shmring.Config{Dir: dir, JobID: "job-1", Generation: 4, Rank: i, Size: n, Secret: secret}
		if cfg != nil {
			cfg(&c)
		}
		p, o, err := shmring.Create(c)
		if err != nil {
			t.Fatalf("rank %d: Create: %v", i, err)
		}
		ps[i], offers[i] = p, o
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
	defer cancel()
	rings := make([]*shmring.Ring, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { rings[i], errs[i] = ps[i].Connect(ctx, offers[(i+n-1)%n]) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, r := range rings {
			if r != nil {
				r.Close()
			}
		}
	})
	return rings, errs
}

func mustConnect(t testing.TB, dir string, n int) []*shmring.Ring {
	t.Helper()
	rings, errs := connect(t, dir, n, nil)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Connect: %v", i, err)
		}
	}
	// Both sides have mapped every segment: no name is left behind.
	if left := entries(t, dir); len(left) != 0 {
		t.Fatalf("segments left in %s after Connect: %v", dir, left)
	}
	return rings
}

func TestSuite(t *testing.T) {
	dir := segDir(t)
	ringtest.Run(t, func(t *testing.T, n int) []aggregator.Ring {
		rings := mustConnect(t, dir, n)
		out := make([]aggregator.Ring, n)
		for i, r := range rings {
			out[i] = r
		}
		return out
	})
	if left := entries(t, dir); len(left) != 0 {
		t.Errorf("segments left in %s: %v", dir, left)
	}
}

// TestCloseWhenDone: ranks that close their ring as soon as their own
// all-reduce returns never make a neighbour that is still finishing fail.
func TestCloseWhenDone(t *testing.T) {
	dir := segDir(t)
	for round := range 20 {
		const n = 3
		rings := mustConnect(t, dir, n)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, r := range rings {
			wg.Go(func() {
				errs[i] = aggregator.AllReduce(ctx, r, make([]float32, 999), 1, aggregator.Options{MaxFrameElems: 16})
				r.Close()
			})
		}
		wg.Wait()
		cancel()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: rank %d: %v", round, i, err)
			}
		}
	}
}

// TestHostID: the same directory gives the same id; another directory
// (another inode) does not.
func TestHostID(t *testing.T) {
	a, err := shmring.HostID("")
	if err != nil {
		t.Skip(err) // no /dev/shm here
	}
	if b, err := shmring.HostID(shmring.DefaultDir); err != nil || b != a {
		t.Errorf("HostID twice: %q, %q (%v)", a, b, err)
	}
	if c, err := shmring.HostID(t.TempDir()); err != nil || c == a {
		t.Errorf("HostID of another directory: %q (%v), same as %q", c, err, a)
	}
}

// TestRefused: a rank with another secret, or of another job or
// generation, cannot join the ring. Whichever side attaches first refuses
// the other's segment with ErrRefused, saying why, and logs it; the other
// side's Connect fails too (the segment it would attach is gone); nothing
// is left in the directory.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name, why string
		cfg       func(c *shmring.Config)
	}{
		{"secret", "does not authenticate with this job's secret", func(c *shmring.Config) { c.Secret = []byte("another secret, same length..") }},
		{"job", "belongs to another job", func(c *shmring.Config) { c.JobID = "job-2" }},
		{"generation", "generation", func(c *shmring.Config) { c.Generation = 3 }},
	} {
		for _, first := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/rank%d-first", tc.name, first), func(t *testing.T) {
				dir := segDir(t)
				var logs shmring.LogBuffer
				ps := make([]*shmring.Pending, 2)
				offers := make([]shmring.Offer, 2)
				for i := range 2 {
					c := shmring.Config{Dir: dir, JobID: "job-1", Generation: 4, Rank: i, Size: 2, Secret: secret,
						Log: slog.New(slog.NewTextHandler(&logs, nil))}
					if i == 1 {
						tc.cfg(&c)
					}
					var err error
					if ps[i], offers[i], err = shmring.Create(c); err != nil {
						t.Fatal(err)
					}
				}
				// The first rank attaches while the other has not started
				// Connect yet, so it is the one that checks and refuses.
				if _, err := ps[first].Connect(t.Context(), offers[1-first]); !errors.Is(err, shmring.ErrRefused) || !strings.Contains(err.Error(), tc.why) {
					t.Errorf("rank %d: Connect: %v, want ErrRefused saying %q", first, err, tc.why)
				}
				if r, err := ps[1-first].Connect(t.Context(), offers[first]); err == nil {
					r.Close()
					t.Errorf("rank %d: connected to a rank that is not in the job", 1-first)
				}
				if !strings.Contains(logs.String(), "segment refused") {
					t.Errorf("no refusal logged; log:\n%s", logs.String())
				}
				if left := entries(t, dir); len(left) != 0 {
					t.Errorf("segments left in %s: %v", dir, left)
				}
			})
		}
	}
}

// TestBellRefused: a bell that is not a 0600 FIFO (here a regular file
// put in its place before the neighbour attaches) is refused like a
// foreign segment, and nothing is left in the directory.
func TestBellRefused(t *testing.T) {
	for _, suffix := range []string{".data", ".space"} {
		t.Run(suffix, func(t *testing.T) {
			dir := segDir(t)
			var logs shmring.LogBuffer
			ps := make([]*shmring.Pending, 2)
			offers := make([]shmring.Offer, 2)
			for i := range 2 {
				var err error
				if ps[i], offers[i], err = shmring.Create(shmring.Config{Dir: dir, JobID: "job-1", Rank: i, Size: 2, Secret: secret,
					Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
					t.Fatal(err)
				}
			}
			bell := filepath.Join(dir, offers[0].Name+suffix)
			if err := os.Remove(bell); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bell, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := ps[1].Connect(t.Context(), offers[0]); !errors.Is(err, shmring.ErrRefused) || !strings.Contains(err.Error(), "FIFO") {
				t.Errorf("Connect: %v, want ErrRefused naming the FIFO", err)
			}
			if r, err := ps[0].Connect(t.Context(), offers[1]); err == nil {
				r.Close()
				t.Error("rank 0 connected to a ring whose bell was replaced")
			}
			if left := entries(t, dir); len(left) != 0 {
				t.Errorf("left in %s: %v", dir, left)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := shmring.Config{JobID: "j", Rank: 1, Size: 2, Secret: secret}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(c *shmring.Config)
		want string
	}{
		{"job", func(c *shmring.Config) { c.JobID = "" }, "JobID"},
		{"rank", func(c *shmring.Config) { c.Rank = 2 }, "Rank 2"},
		{"size", func(c *shmring.Config) { c.Size = 0 }, "Size 0"},
		{"secret", func(c *shmring.Config) { c.Secret = []byte("short") }, "Secret"},
		{"frame", func(c *shmring.Config) { c.MaxFrameElems = aggregator.MaxFrameElemsLimit + 1 }, "MaxFrameElems"},
		{"slots", func(c *shmring.Config) { c.Slots = -1 }, "Slots"},
	} {
		c := good
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", tc.name, err, tc.want)
		}
		if _, _, err := shmring.Create(c); err == nil {
			t.Errorf("%s: Create accepted an invalid config", tc.name)
		}
	}
}

// TestConnectTimeout: a rank whose right neighbour never attaches gives
// up when its context ends and removes its segment.
func TestConnectTimeout(t *testing.T) {
	dir := segDir(t)
	p0, _, err := shmring.Create(shmring.Config{Dir: dir, JobID: "j", Rank: 0, Size: 2, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	p1, o1, err := shmring.Create(shmring.Config{Dir: dir, JobID: "j", Rank: 1, Size: 2, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // rank 1 never connects: rank 0 can only give up
	if _, err := p0.Connect(ctx, o1); !errors.Is(err, context.Canceled) {
		t.Errorf("Connect: %v, want context.Canceled", err)
	}
	if _, err := p0.Connect(t.Context(), o1); err == nil {
		t.Error("a second Connect succeeded")
	}
	p1.Close()
	if left := entries(t, dir); len(left) != 0 {
		t.Errorf("segments left in %s: %v", dir, left)
	}
}

// TestBadOffer: an offer that names no segment of this ring is refused
// before anything is opened.
func TestBadOffer(t *testing.T) {
	dir := segDir(t)
	if err := os.WriteFile(dir+"/passwd", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, o := range []shmring.Offer{
		{Name: "../passwd", Rank: 0, PID: 1},
		{Name: "gradsync-zz0000000000000000000000", Rank: 0, PID: 1},
		{Name: "gradsync-000000000000000000000000", Rank: 1, PID: 1},
		{Name: "gradsync-000000000000000000000000", Rank: 0, PID: 1}, // does not exist
	} {
		p, _, err := shmring.Create(shmring.Config{Dir: dir, JobID: "j", Rank: 1, Size: 2, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Connect(t.Context(), o); err == nil {
			t.Errorf("offer %+v accepted", o)
		}
	}
	if left := entries(t, dir); len(left) != 1 {
		t.Errorf("want only passwd left in %s: %v", dir, left)
	}
}

// TestFrameTooLarge: a frame beyond the slots' size is refused, not cut.
func TestFrameTooLarge(t *testing.T) {
	dir := segDir(t)
	rings, errs := connect(t, dir, 2, func(c *shmring.Config) { c.MaxFrameElems = 100 })
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := rings[0].MaxFrameElems(); m < 100 {
		t.Fatalf("MaxFrameElems() = %d, want at least 100", m)
	}
	err := rings[0].SendRight(t.Context(), aggregator.Frame{Data: make([]float32, rings[0].MaxFrameElems()+1)})
	if err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("SendRight of an oversized frame: %v", err)
	}
}

func ExampleCreate() {
	dir, err := os.MkdirTemp("", "shmring-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	// Each rank (here two goroutines; normally two processes) creates the
	// segment of its link to the right and sends the offer over the
	// control plane to its right neighbour.
	const n = 2
	ps := make([]*shmring.Pending, n)
	offers := make([]shmring.Offer, n)
	for i := range n {
		ps[i], offers[i], err = shmring.Create(shmring.Config{Dir: dir, JobID: "job", Rank: i, Size: n, Secret: secret})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bufs := [][]float32{{1, 2, 3}, {10, 20, 30}}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := ps[i].Connect(ctx, offers[(i+n-1)%n])
			if err != nil {
				fmt.Println(err)
				return
			}
			defer r.Close()
			if err := aggregator.AllReduce(ctx, r, bufs[i], 1, aggregator.Options{}); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(bufs[0], bufs[1])
	// Output: [11 22 33] [11 22 33]
}

// TestPeersSuite runs the peer all-reduce suite (ring, halving-doubling,
// tree) over aggregator.PairPeers made of one two-rank shared-memory ring
// per pair of ranks, set up as the ring is.
func TestPeersSuite(t *testing.T) {
	dir := segDir(t)
	peertest.Run(t, func(t *testing.T, n int) []aggregator.Peers {
		return peertest.Pairs(n, func(i, j int) (aggregator.Ring, aggregator.Ring) {
			rs, errs := connect(t, dir, 2, func(c *shmring.Config) { c.JobID = fmt.Sprintf("job-1/pair-%d-%d", i, j) })
			for k, err := range errs {
				if err != nil {
					t.Fatalf("pair %d-%d rank %d: Connect: %v", i, j, k, err)
				}
			}
			return rs[0], rs[1]
		}) // connect's cleanup closes the rings
	})
	if left := entries(t, dir); len(left) != 0 {
		t.Errorf("segments left in %s: %v", dir, left)
	}
}
