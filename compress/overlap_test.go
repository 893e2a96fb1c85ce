package compress_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
)

// TestOverlappedMatchesReduce: writing the gradient top-down as backward
// does and reporting it with Ready, the overlapped reduction gives bit for
// bit what Reduce gives on the finished gradient, on 1–4 ranks.
func TestOverlappedMatchesReduce(t *testing.T) {
	l := total(testSegs)
	for n := 1; n <= 4; n++ {
		t.Run(name("overlap", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(12, uint64(n)))
			g := randGrads(rng, n, l)
			want := clone2(g)
			ref := newWorld(t, n, func(r aggregator.Ring) (compress.Reducer, error) {
				return compress.NewPlain(r, aggregator.Options{MaxFrameElems: 64}, testSegs, 256), nil
			})
			ref.step(t, want, 3)

			rings := aggregator.NewMemRing(n, 4)
			got := make([][]float32, n)
			errs := make([]error, n)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for r := range n {
				got[r] = make([]float32, l)
				p := compress.NewPlain(rings[r], aggregator.Options{MaxFrameElems: 64}, testSegs, 256)
				cuts := cutPoints(rand.New(rand.NewPCG(uint64(r), 7)), l)
				wg.Go(func() {
					o, err := p.Start(ctx, got[r], 3)
					if err != nil {
						errs[r] = err
						return
					}
					hi := l
					for _, c := range cuts { // "backward": fill [c, hi), then report it
						copy(got[r][c:hi], g[r][c:hi])
						o.Ready(c)
						hi = c
					}
					copy(got[r][:hi], g[r][:hi])
					errs[r] = o.Wait()
				})
			}
			wg.Wait()
			for r := range n {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				for i := range want[r] {
					if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
						t.Fatalf("rank %d element %d: %v, want %v", r, i, got[r][i], want[r][i])
					}
				}
			}
		})
	}
}

// cutPoints returns a few random offsets in (0, l), descending.
func cutPoints(rng *rand.Rand, l int) []int {
	var c []int
	for range 5 {
		c = append(c, 1+rng.IntN(l-1))
	}
	slices.Sort(c)
	slices.Reverse(c)
	return slices.Compact(c)
}

// TestOverlappedCancel: a peer that never joins, and a cancelled step:
// Wait returns the context's error and the goroutine ends (goleak).
func TestOverlappedCancel(t *testing.T) {
	rings := aggregator.NewMemRing(2, 4)
	p := compress.NewPlain(rings[0], aggregator.Options{}, testSegs, 256)
	ctx, cancel := context.WithCancel(context.Background())
	o, err := p.Start(ctx, make([]float32, total(testSegs)), 0)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := o.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v, want context.Canceled", err)
	}
}
