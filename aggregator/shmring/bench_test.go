//go:build linux

package shmring_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
)

// BenchmarkAllReduceSHM times ring all-reduce over shared segments (4 KiB
// to 64 MiB: latency to bandwidth) with
// ranks as goroutines. It reports busbw as nccl-tests and `gradsync bench
// allreduce` do: size/time · 2(n−1)/n, in GB/s (1e9 bytes).
func BenchmarkAllReduceSHM(b *testing.B) {
	for _, kib := range []int{4, 64, 256, 4 << 10, 16 << 10, 64 << 10} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("%dKiB/ranks=%d", kib, n), func(b *testing.B) {
				l := kib << 10 / 4
				rings := mustConnect(b, segDir(b), n)
				bufs := make([][]float32, n)
				for r := range bufs {
					// Zeros stay finite however often they are summed; the
					// cost of an add does not depend on the values.
					bufs[r] = make([]float32, l)
				}
				b.SetBytes(int64(l * 4))
				b.ReportAllocs()
				ctx := b.Context()
				errs := make([]error, n)
				step := int64(0)
				allReduce := func() {
					step++
					var wg sync.WaitGroup
					for r := range n {
						wg.Go(func() { errs[r] = aggregator.AllReduce(ctx, rings[r], bufs[r], step, aggregator.Options{}) })
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							b.Fatalf("rank %d: %v", r, err)
						}
					}
				}
				// Untimed (b.Loop starts the clock): the first call faults
				// in the segments' pages and the buffers'.
				allReduce()
				for b.Loop() {
					allReduce()
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(l*4)/sec/1e9*2*float64(n-1)/float64(n), "busbw-GB/s")
			})
		}
	}
}
