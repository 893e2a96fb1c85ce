package models

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// BlockTimes measures what each of n's blocks (Blocks' order) costs in one
// training step of batch samples on this machine: the seconds of its
// forward and backward, the median over reps steps after one unmeasured
// step (which sizes the layers' buffers). The inputs and the gradient of
// the logits are random; n's parameters, gradients and batch-norm
// statistics change as a step would change them, so measure on a network
// built for the purpose. It runs on the caller's goroutine, one block
// after another (n must not checkpoint activations). Partition with
// Balance{By: ByTime, Times: BlockTimes(…)} cuts by these figures.
func BlockTimes(n *Network, batch, reps int) ([]float64, error) {
	if batch < 1 || reps < 1 {
		return nil, fmt.Errorf("models: BlockTimes of %s: batch %d and reps %d must be at least 1", n.name, batch, reps)
	}
	if n.ck != nil {
		return nil, fmt.Errorf("models: BlockTimes of %s: the network checkpoints activations", n.name)
	}
	blocks := n.Blocks()
	stages := make([]Stage, len(blocks))
	for i, b := range blocks {
		stages[i] = stageOf([]Block{b})
	}
	rng := rand.New(rand.NewPCG(1, uint64(batch)))
	x := make([]float32, batch*n.InputSize())
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	var dlogits []float32
	samples := make([][]float64, len(blocks)) // per block, one figure a step
	for step := range reps + 1 {
		took := make([]time.Duration, len(blocks))
		y := x
		for i, st := range stages {
			t0 := time.Now()
			y = n.ForwardStage(st, y, batch, true)
			took[i] = time.Since(t0)
		}
		if dlogits == nil {
			dlogits = make([]float32, len(y))
			for i := range dlogits {
				dlogits[i] = float32(rng.NormFloat64()) / float32(len(y))
			}
		}
		dy := slices.Clone(dlogits)
		for i := len(stages) - 1; i >= 0 && dy != nil; i-- {
			t0 := time.Now()
			dy = n.BackwardStage(stages[i], dy)
			took[i] += time.Since(t0)
		}
		n.ZeroGrad()
		if step == 0 {
			continue // sizes the buffers; not measured
		}
		for i, d := range took {
			samples[i] = append(samples[i], d.Seconds())
		}
	}
	times := make([]float64, len(blocks))
	for i, s := range samples {
		slices.Sort(s)
		times[i] = s[len(s)/2]
	}
	return times, nil
}
