// Package ringtest is the correctness suite for aggregator.Ring
// implementations: every transport (memory, bufconn, TCP) runs the same
// checks of the ring collectives over it.
package ringtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/internal/suite"
)

// bigLen is "a couple of MiB" of float32 (2.5 MiB), odd so that it is not
// divisible by any world size.
const bigLen = 5<<17 + 13

// Run runs the suite. newRing must return n connected ranks, element i
// being rank i; each subtest gets fresh rings. If the rings implement
// io.Closer, Close (which must be safe to call while the rank's SendRight
// and RecvLeft are running) must break that rank as if it died, so that its
// neighbours' calls fail with an error wrapping *aggregator.PeerError naming
// it; the dead-rank tests are skipped otherwise. Rings are closed in
// t.Cleanup by newRing's owner, not by the suite.
func Run(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	t.Run("AllReduceExact", func(t *testing.T) { testAllReduceExact(t, newRing) })
	t.Run("AllReduceRandom", func(t *testing.T) { testAllReduceRandom(t, newRing) })
	t.Run("Sequence", func(t *testing.T) { testSequence(t, newRing) })
	t.Run("AllGather", func(t *testing.T) { testAllGather(t, newRing) })
	t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, newRing) })
	t.Run("Barrier", func(t *testing.T) { testBarrier(t, newRing) })
	t.Run("Mismatch", func(t *testing.T) { testMismatch(t, newRing) })
	t.Run("DeadRank", func(t *testing.T) { testDeadRank(t, newRing) })
}

// each runs fn concurrently on every rank under one context and returns
// the per-rank errors and how long each rank took.
// frameCheck wraps a Ring and records the largest payload it sent.
type frameCheck struct {
	aggregator.Ring
	max *atomic.Int64
}

func (c frameCheck) SendRight(ctx context.Context, f aggregator.Frame) error {
	for {
		m := c.max.Load()
		if int64(len(f.Data)) <= m || c.max.CompareAndSwap(m, int64(len(f.Data))) {
			break
		}
	}
	return c.Ring.SendRight(ctx, f)
}

func withFrameCheck(rings []aggregator.Ring) ([]aggregator.Ring, *atomic.Int64) {
	var m atomic.Int64
	out := make([]aggregator.Ring, len(rings))
	for i, r := range rings {
		out[i] = frameCheck{r, &m}
	}
	return out, &m
}

// lengths are the buffer lengths tried for world size n, without repeats.
func lengths(n int, big bool) []int {
	ls := []int{0, 1, n - 1, n, n + 1, 4099}
	if big {
		ls = append(ls, bigLen)
	}
	var out []int
	seen := map[int]bool{}
	for _, l := range ls {
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}

// exactInput is rank r's element i: (r+1)·(i mod 251 + 1), a small integer,
// so every partial sum is exact in float32 and the expected total is
// n(n+1)/2·(i mod 251 + 1) whatever the summation order. Varying with i
// catches misplaced offsets.
func testAllReduceExact(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for n := 1; n <= 8; n++ {
		for _, l := range lengths(n, true) {
			frames := []int{0}
			if l <= 4099 {
				frames = append(frames, 7) // many sub-chunks per ring chunk
			}
			for _, fe := range frames {
				t.Run(fmt.Sprintf("n=%d/len=%d/frame=%d", n, l, fe), func(t *testing.T) {
					opt := aggregator.Options{MaxFrameElems: fe, Generation: 3}
					rings, maxSeen := withFrameCheck(newRing(t, n))
					bufs := make([][]float32, n)
					for r := range bufs {
						bufs[r] = make([]float32, l)
						for i := range bufs[r] {
							bufs[r][i] = suite.ExactInput(r, i)
						}
					}
					errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
						return aggregator.AllReduce(ctx, r, bufs[rank], 1, opt)
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

func testAllReduceRandom(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for _, n := range []int{2, 3, 5, 8} {
		for _, l := range []int{4099, 100003} {
			for _, fe := range []int{0, 1000} {
				t.Run(fmt.Sprintf("n=%d/len=%d/frame=%d", n, l, fe), func(t *testing.T) {
					rings := newRing(t, n)
					bufs := make([][]float32, n)
					want := make([]float64, l)
					abs := make([]float64, l)
					for r := range bufs {
						rng := rand.New(rand.NewPCG(uint64(n*1000003+l), uint64(r)))
						bufs[r] = make([]float32, l)
						for i := range bufs[r] {
							// Mixed magnitudes make the summation order matter.
							v := float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
							bufs[r][i] = v
							want[i] += float64(v)
							abs[i] += math.Abs(float64(v))
						}
					}
					opt := aggregator.Options{MaxFrameElems: fe}
					errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
						return aggregator.AllReduce(ctx, r, bufs[rank], 9, opt)
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
						tol := float64(n)*1.2e-7*abs[i] + 1e-30
						if d := math.Abs(float64(bufs[0][i]) - want[i]); d > tol {
							t.Fatalf("buf[%d] = %v, float64 sum %v: |diff| %g > %g", i, bufs[0][i], want[i], d, tol)
						}
					}
				})
			}
		}
	}
}

// testSequence runs different collectives back to back on the same rings
// with increasing steps.
func testSequence(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for _, n := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rings := newRing(t, n)
			const l = 1031
			opt := aggregator.Options{MaxFrameElems: 100, Generation: 7}
			bufs := make([][]float32, n)
			gathered := make([][]float32, n)
			for r := range bufs {
				bufs[r] = make([]float32, l)
				gathered[r] = make([]float32, n*l)
			}
			tri := float32(n * (n + 1) / 2)
			errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
				b := bufs[rank]
				for step := int64(1); step <= 3; step++ {
					for i := range b {
						b[i] = float32(step) * suite.ExactInput(rank, i)
					}
					if err := aggregator.AllReduce(ctx, r, b, step, opt); err != nil {
						return err
					}
					for i, v := range b {
						if want := float32(step) * tri * float32(i%251+1); v != want {
							return fmt.Errorf("step %d: buf[%d] = %v, want %v", step, i, v, want)
						}
					}
				}
				if err := aggregator.Barrier(ctx, r, 4, opt); err != nil {
					return err
				}
				if err := aggregator.AllGather(ctx, r, gathered[rank], b, 5, opt); err != nil {
					return err
				}
				if rank == n-1 {
					b[0] = -1
				}
				if err := aggregator.Broadcast(ctx, r, b, n-1, 6, opt); err != nil {
					return err
				}
				if b[0] != -1 {
					return fmt.Errorf("after broadcast buf[0] = %v, want -1", b[0])
				}
				return aggregator.AllReduce(ctx, r, b[:0], 7, opt)
			})
			suite.MustAll(t, errs)
			for r, g := range gathered {
				for i, v := range g {
					if want := 3 * tri * float32(i%l%251+1); v != want {
						t.Fatalf("rank %d: gathered[%d] = %v, want %v", r, i, v, want)
					}
				}
			}
		})
	}
}

func testAllGather(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for n := 1; n <= 8; n++ {
		for _, k := range []int{0, 1, 3, 4099} {
			for _, fe := range []int{0, 5} {
				t.Run(fmt.Sprintf("n=%d/k=%d/frame=%d", n, k, fe), func(t *testing.T) {
					rings := newRing(t, n)
					dsts := make([][]float32, n)
					errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
						src := make([]float32, k)
						for j := range src {
							src[j] = float32(rank*100000 + j)
						}
						dsts[rank] = make([]float32, n*k)
						for i := range dsts[rank] {
							dsts[rank][i] = float32(math.NaN())
						}
						return aggregator.AllGather(ctx, r, dsts[rank], src, 2, aggregator.Options{MaxFrameElems: fe})
					})
					suite.MustAll(t, errs)
					for r, d := range dsts {
						for i, v := range d {
							if want := float32(i/k*100000 + i%k); v != want {
								t.Fatalf("rank %d: dst[%d] = %v, want %v", r, i, v, want)
							}
						}
					}
				})
			}
		}
	}
}

func testBroadcast(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for n := 1; n <= 8; n++ {
		for root := range n {
			for _, l := range []int{0, 1, 4099} {
				for _, fe := range []int{0, 64} {
					t.Run(fmt.Sprintf("n=%d/root=%d/len=%d/frame=%d", n, root, l, fe), func(t *testing.T) {
						rings := newRing(t, n)
						bufs := make([][]float32, n)
						for r := range bufs {
							bufs[r] = make([]float32, l)
							for i := range bufs[r] {
								if r == root {
									bufs[r][i] = float32(i) + 0.5
								} else {
									bufs[r][i] = float32(math.NaN())
								}
							}
						}
						errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
							return aggregator.Broadcast(ctx, r, bufs[rank], root, 3, aggregator.Options{MaxFrameElems: fe})
						})
						suite.MustAll(t, errs)
						for r, b := range bufs {
							for i, v := range b {
								if want := float32(i) + 0.5; v != want {
									t.Fatalf("rank %d: buf[%d] = %v, want %v", r, i, v, want)
								}
							}
						}
					})
				}
			}
		}
	}
}

// testBarrier checks the barrier property directly: every rank counts
// itself in before the barrier, so after it every rank must see all n.
func testBarrier(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rings := newRing(t, n)
			const rounds = 5
			var entered [rounds]atomic.Int32
			errs, _ := suite.Each(suite.OKCtx(t), rings, func(ctx context.Context, rank int, r aggregator.Ring) error {
				for round := range rounds {
					entered[round].Add(1)
					if err := aggregator.Barrier(ctx, r, int64(round), aggregator.Options{}); err != nil {
						return err
					}
					if got := entered[round].Load(); got != int32(n) {
						return fmt.Errorf("round %d: left the barrier when %d of %d ranks had entered", round, got, n)
					}
				}
				return nil
			})
			suite.MustAll(t, errs)
		})
	}
}

// failCase is one scenario in which collectives must fail. The cases of a
// test run concurrently, so that the ranks that can only fail by their
// deadline wait for it once per test rather than once per case.
type failCase = suite.FailCase[aggregator.Ring]

// allFail checks that every rank except skip (-1: none) failed.
func allFail(t *testing.T, errs []error, skip int) {
	t.Helper()
	for r, err := range errs {
		if r != skip && err == nil {
			t.Errorf("rank %d: succeeded, want an error", r)
		}
	}
}

// testMismatch makes rank 0 disagree with the others about the call: the
// disagreement must be reported as ErrUnexpectedFrame, and no rank may hang.
func testMismatch(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	kinds := []struct {
		name string
		minN int
		// allFail: every rank must fail. Otherwise ranks that only send
		// (a broadcast root) may complete if the links buffer their frames.
		allFail bool
		call    func(ctx context.Context, rank int, r aggregator.Ring) error
	}{
		{"step", 2, true, func(ctx context.Context, rank int, r aggregator.Ring) error {
			step := int64(8)
			if rank == 0 {
				step = 7
			}
			return aggregator.AllReduce(ctx, r, make([]float32, 100), step, aggregator.Options{})
		}},
		{"length", 2, true, func(ctx context.Context, rank int, r aggregator.Ring) error {
			l := 101
			if rank == 0 {
				l = 100
			}
			return aggregator.AllReduce(ctx, r, make([]float32, l), 1, aggregator.Options{})
		}},
		{"generation", 2, true, func(ctx context.Context, rank int, r aggregator.Ring) error {
			return aggregator.AllReduce(ctx, r, make([]float32, 100), 1, aggregator.Options{Generation: uint64(min(rank, 1))})
		}},
		{"op", 2, true, func(ctx context.Context, rank int, r aggregator.Ring) error {
			if rank == 0 {
				return aggregator.Barrier(ctx, r, 1, aggregator.Options{})
			}
			return aggregator.AllReduce(ctx, r, make([]float32, 100), 1, aggregator.Options{})
		}},
		{"root", 3, false, func(ctx context.Context, rank int, r aggregator.Ring) error {
			root := 2
			if rank == 0 {
				root = 0
			}
			return aggregator.Broadcast(ctx, r, make([]float32, 100), root, 1, aggregator.Options{})
		}},
	}
	var cases []failCase
	for _, n := range []int{2, 3, 4} {
		for _, k := range kinds {
			if n < k.minN {
				continue
			}
			cases = append(cases, failCase{
				Name:  fmt.Sprintf("%s/n=%d", k.name, n),
				Ranks: newRing(t, n),
				Call:  k.call,
				Check: func(t *testing.T, errs []error) {
					if k.allFail {
						allFail(t, errs, -1)
					}
					// Rank 1 gets rank 0's frames, and rank 0 (unless it only
					// sends) gets rank n−1's; either may see the mismatch
					// first and stop sending, so one of them must report it.
					if !errors.Is(errs[0], aggregator.ErrUnexpectedFrame) && !errors.Is(errs[1], aggregator.ErrUnexpectedFrame) {
						t.Errorf("got %v (rank 0) and %v (rank 1), want one wrapping ErrUnexpectedFrame", errs[0], errs[1])
					}
				},
			})
		}
	}
	suite.RunFailing(t, cases)
}

// killer wraps the victim's Ring: after it has received `after` frames it
// closes itself, as if the process died mid-call.
type killer struct {
	aggregator.Ring
	after int
	n     int // frames received; touched only by RecvLeft
}

func (k *killer) RecvLeft(ctx context.Context) (aggregator.Frame, error) {
	if k.n == k.after {
		if err := k.Ring.(io.Closer).Close(); err != nil {
			return aggregator.Frame{}, err
		}
	}
	k.n++
	return k.Ring.RecvLeft(ctx)
}

// testDeadRank kills rank n/2 before or during an AllReduce: every other
// rank must fail, none may hang, and the dead rank's right neighbour must
// name it.
func testDeadRank(t *testing.T, newRing func(t *testing.T, n int) []aggregator.Ring) {
	var cases []failCase
	for _, n := range []int{2, 3, 5, 8} {
		for _, when := range []string{"before", "during"} {
			rings := slices.Clone(newRing(t, n)) // newRing's owner may close the originals
			victim := n / 2
			closer, ok := rings[victim].(io.Closer)
			if !ok {
				t.Skipf("%T does not implement io.Closer", rings[victim])
			}
			if when == "before" {
				if err := closer.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				rings[victim] = &killer{Ring: rings[victim], after: 5}
			}
			cases = append(cases, failCase{
				Name:  fmt.Sprintf("%s/n=%d", when, n),
				Ranks: rings,
				Call: func(ctx context.Context, rank int, r aggregator.Ring) error {
					if when == "before" && rank == victim {
						return nil
					}
					// Small frames: many of them, so the victim dies mid-call.
					return aggregator.AllReduce(ctx, r, make([]float32, 4099), 1, aggregator.Options{MaxFrameElems: 16})
				},
				Check: func(t *testing.T, errs []error) {
					skip := -1
					if when == "before" {
						skip = victim
					}
					allFail(t, errs, skip)
					right := (victim + 1) % n
					if pe := new(aggregator.PeerError); !errors.As(errs[right], &pe) || pe.Rank != victim {
						t.Errorf("rank %d (right of the dead rank %d): got %v, want a *PeerError naming rank %d", right, victim, errs[right], victim)
					} else if !errors.Is(errs[right], aggregator.ErrPeerGone) {
						t.Errorf("rank %d: %v does not wrap ErrPeerGone", right, errs[right])
					}
				},
			})
		}
	}
	suite.RunFailing(t, cases)
}
