// Package peertest is the correctness suite for the all-reduce algorithms
// over aggregator.Peers implementations: every algorithm (ring through
// aggregator.PeerRing, halving-doubling, tree) runs the same checks over
// every transport, as ringtest does for aggregator.Ring.
package peertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/internal/suite"
)

// NewPeers returns n connected ranks, element i being rank i, fresh for
// each call. If they implement io.Closer, Close (safe to call while the
// rank's Send and Recv run) must break that rank as if it died; the
// dead-rank tests are skipped otherwise. newPeers's owner closes them in
// t.Cleanup.
type NewPeers func(t *testing.T, n int) []aggregator.Peers

// Run runs the suite for every algorithm in aggregator.Algorithms.
func Run(t *testing.T, newPeers NewPeers) {
	for _, a := range aggregator.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Run("Exact", func(t *testing.T) { testExact(t, a, newPeers) })
			t.Run("Random", func(t *testing.T) { testRandom(t, a, newPeers) })
			t.Run("Mismatch", func(t *testing.T) { testMismatch(t, a, newPeers) })
			t.Run("DeadRank", func(t *testing.T) { testDeadRank(t, a, newPeers) })
		})
	}
	t.Run("Sequence", func(t *testing.T) { testSequence(t, newPeers) })
}

// jitter wraps a Peers and sleeps a random 0–200 µs before about a third
// of its Sends and Recvs, so that frames arrive in many interleavings. The
// sleeps only perturb timing; nothing waits on them for correctness.
type jitter struct {
	aggregator.Peers
	mu  sync.Mutex // guards rng: Send runs on several goroutines
	rng *rand.Rand
}

func withJitter(ps []aggregator.Peers, seed uint64) []aggregator.Peers {
	out := make([]aggregator.Peers, len(ps))
	for i, p := range ps {
		out[i] = &jitter{Peers: p, rng: rand.New(rand.NewPCG(seed, uint64(i)))}
	}
	return out
}

func (j *jitter) pause() {
	j.mu.Lock()
	d := time.Duration(0)
	if j.rng.IntN(3) == 0 {
		d = time.Duration(j.rng.IntN(200)) * time.Microsecond
	}
	j.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

func (j *jitter) Send(ctx context.Context, to int, f aggregator.Frame) error {
	j.pause()
	return j.Peers.Send(ctx, to, f)
}

func (j *jitter) Recv(ctx context.Context, from int) (aggregator.Frame, error) {
	j.pause()
	return j.Peers.Recv(ctx, from)
}

// frameCheck records the largest payload sent.
type frameCheck struct {
	aggregator.Peers
	max *atomic.Int64
}

func (c frameCheck) Send(ctx context.Context, to int, f aggregator.Frame) error {
	for {
		m := c.max.Load()
		if int64(len(f.Data)) <= m || c.max.CompareAndSwap(m, int64(len(f.Data))) {
			break
		}
	}
	return c.Peers.Send(ctx, to, f)
}

// lengths are the buffer lengths tried for world size n, without repeats:
// 0, 1, n−1, n, n+1, odd lengths, and one of several frames per block.
func lengths(n int) []int {
	ls := []int{0, 1, n - 1, n, n + 1, 7, 1031, 4099}
	slices.Sort(ls)
	return slices.Compact(ls)
}

// exactInput is rank r's element i: a small integer, so every partial sum
// is exact in float32 and the total is n(n+1)/2·(i mod 251 + 1) whatever
// the summation order.
//
// The cases of one world run one after another on the same ranks (each
// its own step), as a job's collectives do: setting up a world of pairs
// costs far more than a small collective over it.
func testExact(t *testing.T, a aggregator.Algorithm, newPeers NewPeers) {
	for n := 1; n <= 5; n++ {
		base := newPeers(t, n)
		step := int64(0)
		for _, l := range lengths(n) {
			for _, fe := range []int{0, 7} {
				step++
				t.Run(fmt.Sprintf("n=%d/len=%d/frame=%d", n, l, fe), func(t *testing.T) {
					opt := aggregator.Options{MaxFrameElems: fe, Generation: 3}
					var maxSeen atomic.Int64
					ps := withJitter(base, uint64(n*100000+l))
					for i, p := range ps {
						ps[i] = frameCheck{p, &maxSeen}
					}
					bufs := make([][]float32, n)
					for r := range bufs {
						bufs[r] = make([]float32, l)
						for i := range bufs[r] {
							bufs[r][i] = suite.ExactInput(r, i)
						}
					}
					errs, _ := suite.Each(suite.OKCtx(t), ps, func(ctx context.Context, rank int, p aggregator.Peers) error {
						return aggregator.AllReduceWith(ctx, p, a, bufs[rank], step, opt)
					})
					suite.MustAll(t, errs)
					tri := n * (n + 1) / 2
					for r, b := range bufs {
						for i, v := range b {
							if want := float32(tri * (i%251 + 1)); v != want {
								t.Fatalf("rank %d: buf[%d] = %v, want %v", r, i, v, want)
							}
						}
					}
					limit := int64(aggregator.DefaultMaxFrameElems)
					if fe != 0 {
						limit = int64(fe)
					}
					if m := maxSeen.Load(); m > limit {
						t.Errorf("largest frame carried %d elements, limit %d", m, limit)
					}
				})
			}
		}
	}
}

// testRandom sums values of mixed magnitudes, where the summation order
// matters: every rank must hold the same bits, and the result must be
// within rounding of the serial float32 sum rank 0 + rank 1 + … (the
// algorithms sum in their own fixed orders, so the bits may differ from
// the serial sum's, never between ranks).
func testRandom(t *testing.T, a aggregator.Algorithm, newPeers NewPeers) {
	for n := 2; n <= 5; n++ {
		base := newPeers(t, n) // the world's cases in turn, as in testExact
		step := int64(0)
		for _, l := range []int{n + 1, 4099, 100003} {
			for _, fe := range []int{0, 1000} {
				step++
				t.Run(fmt.Sprintf("n=%d/len=%d/frame=%d", n, l, fe), func(t *testing.T) {
					ps := withJitter(base, uint64(l))
					bufs := make([][]float32, n)
					serial := make([]float32, l)
					abs := make([]float64, l)
					for r := range bufs {
						rng := rand.New(rand.NewPCG(uint64(n*1000003+l), uint64(r)))
						bufs[r] = make([]float32, l)
						for i := range bufs[r] {
							v := float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
							bufs[r][i] = v
							serial[i] += v
							abs[i] += math.Abs(float64(v))
						}
					}
					opt := aggregator.Options{MaxFrameElems: fe}
					errs, _ := suite.Each(suite.OKCtx(t), ps, func(ctx context.Context, rank int, p aggregator.Peers) error {
						return aggregator.AllReduceWith(ctx, p, a, bufs[rank], step, opt)
					})
					suite.MustAll(t, errs)
					for i := range l {
						bits := math.Float32bits(bufs[0][i])
						for r := 1; r < n; r++ {
							if b := math.Float32bits(bufs[r][i]); b != bits {
								t.Fatalf("buf[%d]: rank %d has %v (%#x), rank 0 has %v (%#x): not bit-identical",
									i, r, bufs[r][i], b, bufs[0][i], bits)
							}
						}
						// Both sums round at most n−1 times.
						tol := 2*float64(n)*6e-8*abs[i] + 1e-30
						if d := math.Abs(float64(bufs[0][i]) - float64(serial[i])); d > tol {
							t.Fatalf("buf[%d] = %v, serial float32 sum %v: |diff| %g > %g", i, bufs[0][i], serial[i], d, tol)
						}
					}
				})
			}
		}
	}
}

// testSequence runs the algorithms back to back on the same peers with
// increasing steps, so that a frame left over from one call would be met
// by the next.
func testSequence(t *testing.T, newPeers NewPeers) {
	for _, n := range []int{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ps := withJitter(newPeers(t, n), uint64(n))
			const l = 1031
			opt := aggregator.Options{MaxFrameElems: 100, Generation: 7}
			tri := float32(n * (n + 1) / 2)
			errs, _ := suite.Each(suite.OKCtx(t), ps, func(ctx context.Context, rank int, p aggregator.Peers) error {
				b := make([]float32, l)
				step := int64(0)
				for range 2 {
					for _, a := range aggregator.Algorithms {
						step++
						for i := range b {
							b[i] = float32(step) * suite.ExactInput(rank, i)
						}
						if err := aggregator.AllReduceWith(ctx, p, a, b, step, opt); err != nil {
							return err
						}
						for i, v := range b {
							if want := float32(step) * tri * float32(i%251+1); v != want {
								return fmt.Errorf("%v step %d: buf[%d] = %v, want %v", a, step, i, v, want)
							}
						}
					}
				}
				return nil
			})
			suite.MustAll(t, errs)
		})
	}
}

type failCase = suite.FailCase[aggregator.Peers]

// testMismatch makes rank 0 disagree with the others about the call (its
// step, length, generation or algorithm): every rank must fail, none may
// hang, and some rank must report ErrUnexpectedFrame — except when rank 0
// runs another algorithm: then the ranks may all wait on receives that no
// frame will ever answer (a tree root waits on its children while they
// wait on rank 0), and only the deadline ends the call.
func testMismatch(t *testing.T, a aggregator.Algorithm, newPeers NewPeers) {
	other := aggregator.AlgoTree
	if a == aggregator.AlgoTree {
		other = aggregator.AlgoHalvingDoubling
	}
	kinds := []struct {
		name   string
		detect bool // some rank must see ErrUnexpectedFrame
		call   func(ctx context.Context, rank int, p aggregator.Peers) error
	}{
		{"step", true, func(ctx context.Context, rank int, p aggregator.Peers) error {
			step := int64(8)
			if rank == 0 {
				step = 7
			}
			return aggregator.AllReduceWith(ctx, p, a, make([]float32, 100), step, aggregator.Options{})
		}},
		{"length", true, func(ctx context.Context, rank int, p aggregator.Peers) error {
			l := 101
			if rank == 0 {
				l = 100
			}
			return aggregator.AllReduceWith(ctx, p, a, make([]float32, l), 1, aggregator.Options{})
		}},
		{"generation", true, func(ctx context.Context, rank int, p aggregator.Peers) error {
			return aggregator.AllReduceWith(ctx, p, a, make([]float32, 100), 1, aggregator.Options{Generation: uint64(min(rank, 1))})
		}},
		{"algorithm", false, func(ctx context.Context, rank int, p aggregator.Peers) error {
			algo := a
			if rank == 0 {
				algo = other
			}
			return aggregator.AllReduceWith(ctx, p, algo, make([]float32, 100), 1, aggregator.Options{})
		}},
	}
	var cases []failCase
	for _, n := range []int{2, 3, 5} {
		for _, k := range kinds {
			cases = append(cases, failCase{
				Name:  fmt.Sprintf("%s/n=%d", k.name, n),
				Ranks: newPeers(t, n),
				Call:  k.call,
				Check: func(t *testing.T, errs []error) {
					some := false
					for r, err := range errs {
						if err == nil {
							t.Errorf("rank %d: succeeded, want an error", r)
						}
						some = some || errors.Is(err, aggregator.ErrUnexpectedFrame)
					}
					if k.detect && !some {
						t.Errorf("no rank reported ErrUnexpectedFrame: %v", errs)
					}
				},
			})
		}
	}
	suite.RunFailing(t, cases)
}

// killer wraps the victim: when it is about to send its frame number
// after, it closes itself, as if the process died mid-call. Killing on a
// send, early, means the victim's contribution never fully leaves it, so
// no survivor can complete the sum.
type killer struct {
	aggregator.Peers
	after int64
	sent  atomic.Int64 // Send runs on several goroutines
}

func (k *killer) Send(ctx context.Context, to int, f aggregator.Frame) error {
	if k.sent.Add(1)-1 == k.after {
		if err := k.Peers.(io.Closer).Close(); err != nil {
			return err
		}
	}
	return k.Peers.Send(ctx, to, f)
}

// testDeadRank kills rank n/2 before or during an all-reduce: every other
// rank must fail without hanging. With the peer algorithms every survivor
// must name the dead rank (a *PeerError wrapping ErrPeerGone), the ranks
// that never talked to it through the abort notices of those that did.
// With the ring (which sends no notices, as AllReduce over a Ring) the
// dead rank's right neighbour must name it, as in ringtest, and the
// others fail by their deadline at the latest.
func testDeadRank(t *testing.T, a aggregator.Algorithm, newPeers NewPeers) {
	var cases []failCase
	for _, n := range []int{2, 3, 4, 5} {
		for _, when := range []string{"before", "during"} {
			ps := slices.Clone(newPeers(t, n)) // newPeers's owner may close the originals
			victim := n / 2
			closer, ok := ps[victim].(io.Closer)
			if !ok {
				t.Skipf("%T does not implement io.Closer", ps[victim])
			}
			if when == "before" {
				if err := closer.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				ps[victim] = &killer{Peers: ps[victim], after: 3}
			}
			cases = append(cases, failCase{
				Name:  fmt.Sprintf("%s/n=%d", when, n),
				Ranks: ps,
				Call: func(ctx context.Context, rank int, p aggregator.Peers) error {
					if when == "before" && rank == victim {
						return nil
					}
					return aggregator.AllReduceWith(ctx, p, a, make([]float32, 4099), 1, aggregator.Options{MaxFrameElems: 16})
				},
				Check: func(t *testing.T, errs []error) {
					for r, err := range errs {
						if r == victim {
							if when == "during" && err == nil {
								t.Errorf("rank %d (the victim): succeeded, want an error", r)
							}
							continue
						}
						if err == nil {
							t.Errorf("rank %d: succeeded, want an error", r)
							continue
						}
						mustName := a != aggregator.AlgoRing || r == (victim+1)%n
						if !mustName {
							continue
						}
						if pe := new(aggregator.PeerError); !errors.As(err, &pe) || pe.Rank != victim || !errors.Is(err, aggregator.ErrPeerGone) {
							t.Errorf("rank %d: got %v, want a *PeerError naming rank %d wrapping ErrPeerGone", r, err, victim)
						}
					}
				},
			})
		}
	}
	suite.RunFailing(t, cases)
}

// Pairs builds n ranks of aggregator.PairPeers from two-rank rings:
// link(i, j), for every i < j, returns the ring of that pair as seen by
// rank i (its rank 0) and by rank j (its rank 1). Closing a rank's Peers
// closes its end of every pair.
func Pairs(n int, link func(i, j int) (ri, rj aggregator.Ring)) []aggregator.Peers {
	pairs := make([][]aggregator.Ring, n)
	for i := range pairs {
		pairs[i] = make([]aggregator.Ring, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			pairs[i][j], pairs[j][i] = link(i, j)
		}
	}
	ps := make([]aggregator.Peers, n)
	for i := range n {
		ps[i] = aggregator.NewPairPeers(i, pairs[i])
	}
	return ps
}
