package models

import (
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/gradsync/gradsync/internal/kernels"
)

// TestLayerTimes prints the mean Forward and Backward time of each layer
// of one training step of GRADSYNC_LAYER_TIMES (an architecture name) at
// batch 64 on the current GEMM backend; it is skipped unless that is set:
//
//	GRADSYNC_LAYER_TIMES=cnn go test ./models -run LayerTimes -v
func TestLayerTimes(t *testing.T) {
	name := os.Getenv("GRADSYNC_LAYER_TIMES")
	if name == "" {
		t.Skip("set GRADSYNC_LAYER_TIMES=<architecture> to print per-layer times")
	}
	n, err := New(name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const batch = 64
	r := rand.New(rand.NewPCG(8, 8))
	x := randn(r, batch*n.InputSize())
	labels := make([]uint8, batch)
	classes := n.Options().Classes
	d := make([]float32, batch*classes)
	fw := make([]time.Duration, len(n.layers))
	bw := make([]time.Duration, len(n.layers))
	const steps = 40
	for s := range steps + 3 {
		n.ZeroGrad()
		h := x
		for i, l := range n.layers {
			t0 := time.Now()
			h = l.Forward(h, batch, true)
			if s >= 3 {
				fw[i] += time.Since(t0)
			}
		}
		SoftmaxCrossEntropy(h, labels, classes, d)
		g := d
		for i := len(n.layers) - 1; i >= 0; i-- {
			t0 := time.Now()
			g = n.layers[i].Backward(g)
			if s >= 3 {
				bw[i] += time.Since(t0)
			}
			if g == nil {
				break
			}
		}
	}
	var tot time.Duration
	for i, l := range n.layers {
		t.Logf("%2d %-22T fwd %6.2f ms  bwd %6.2f ms", i, l, float64(fw[i])/steps/1e6, float64(bw[i])/steps/1e6)
		tot += fw[i] + bw[i]
	}
	t.Logf("total %.2f ms per step (%s, %s, batch %d)", float64(tot)/steps/1e6, name, kernels.Backend(), batch)
}
