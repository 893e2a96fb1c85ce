package compress_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
)

// BenchmarkCNN times one Reduce of the cnn model's gradient (1,199,882
// float32) on one rank, so the time is all compression; sent-B/step is the
// message one rank contributes per step and ratio raw/sent.
func BenchmarkCNN(b *testing.B) {
	segs := cnnSegments(b)
	cases := []struct {
		name string
		mk   factory
	}{
		{"plain", func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewPlain(r, aggregator.Options{}, segs, 0), nil
		}},
		{"powersgd-r1", powerSGD(compress.PowerSGDConfig{Rank: 1}, segs)},
		{"powersgd-r2", powerSGD(compress.PowerSGDConfig{Rank: 2}, segs)},
		{"powersgd-r4", powerSGD(compress.PowerSGDConfig{Rank: 4}, segs)},
		{"topk-1%", func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewTopK(r, aggregator.Options{}, segs, 0, compress.TopKConfig{Ratio: 0.01})
		}},
		{"int8", func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewInt8(r, aggregator.Options{}, segs, 0, compress.Int8Config{})
		}},
		{"fp16", func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewCast(r, aggregator.Options{}, segs, 0, compress.FP16, compress.CastConfig{})
		}},
		{"bf16", func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewCast(r, aggregator.Options{}, segs, 0, compress.BF16, compress.CastConfig{})
		}},
	}
	src := randVec(rand.New(rand.NewPCG(1, 1)), total(segs))
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			red, err := c.mk(aggregator.NewMemRing(1, 0)[0])
			if err != nil {
				b.Fatal(err)
			}
			g := make([]float32, len(src))
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(src)))
			step := int64(0)
			for b.Loop() {
				copy(g, src)
				if err := red.Reduce(ctx, g, step); err != nil {
					b.Fatal(err)
				}
				step++
			}
			st := red.Stats()
			b.ReportMetric(float64(st.SentBytes)/float64(st.Steps), "sent-B/step")
			b.ReportMetric(st.Ratio(), "ratio")
		})
	}
}
