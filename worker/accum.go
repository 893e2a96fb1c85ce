package worker

import (
	"time"

	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/models"
)

// forwardBackward computes the mean loss of batch and adds its gradient
// into net's gradient buffer, in micro-batches of at most micro examples
// (gradient accumulation: k forward/backward passes, then one reduction
// and one optimiser step, as DDP's no_sync). Each micro-batch's loss
// gradient is weighted by its share of the batch, so the accumulated
// gradient is that of the batch's mean loss, whatever the split (batch
// norm statistics and dropout masks are per micro-batch, as in PyTorch).
// ready (nil: none) hears backward's progress in the last micro-batch
// only: before it, no gradient is final. x and dl hold micro examples. An
// empty batch adds nothing and returns 0. An error making a batch
// (obj.batch) is returned as it is. scale multiplies the loss gradient
// (the fp16 loss scale; 1 otherwise). lt (nil: none) records each
// micro-batch's forward and each layer's backward.
func forwardBackward(net *models.Network, obj objective, batch []int, micro int, x, dl []float32, epoch int, scale float32, ready func(from int), lt *layerTrace) (float32, error) {
	n := len(batch)
	if n == 0 {
		return 0, nil
	}
	inSize, classes := net.InputSize(), net.Options().Classes
	var loss float64
	for lo := 0; lo < n; lo += micro {
		part := batch[lo:min(lo+micro, n)]
		k := len(part)
		if err := obj.batch(part, x[:k*inSize], epoch); err != nil {
			return 0, err
		}
		var fwd time.Time
		if lt != nil {
			fwd = time.Now()
		}
		logits := net.Forward(x[:k*inSize], k, true)
		d := dl[:k*classes]
		l := obj.loss(logits, k, d)
		loss += float64(l) * float64(k)
		if k != n || scale != 1 {
			w := float32(k) / float32(n)
			if k == n {
				w = 1
			}
			for i := range d {
				d[i] = d[i] * w * scale
			}
		}
		var notify func(int)
		if lo+micro >= n {
			notify = ready
		}
		if lt != nil {
			now := time.Now()
			lt.rec.Span("forward + loss", trace.CatStep, trace.TidCompute, fwd, now, map[string]any{"samples": k})
			notify = lt.backward(now, notify)
		}
		net.BackwardNotify(d, notify)
	}
	return float32(loss / float64(n)), nil
}
