package worker

import (
	"math"
	"testing"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestForwardBackwardAccumulates: a batch of 30 in micro-batches of 8
// (8, 8, 8, 6) gives the gradient and loss of the whole batch at once, and
// ready hears only the last micro-batch's backward.
func TestForwardBackwardAccumulates(t *testing.T) {
	train, test, err := data.Synthetic(64, 10, 5)
	if err != nil {
		t.Fatal(err)
	}
	obj := newClassification(train, test, &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "synthetic"}})
	batch := make([]int, 30)
	for i := range batch {
		batch[i] = 2 * i
	}
	run := func(micro int) (*models.Network, float32, int) {
		net, err := models.New("mlp", models.Options{Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, micro*net.InputSize())
		dl := make([]float32, micro*10)
		calls := 0
		loss, err := forwardBackward(net, obj, batch, micro, x, dl, 0, 1, func(int) { calls++ }, nil)
		if err != nil {
			t.Fatal(err)
		}
		return net, loss, calls
	}
	whole, wl, wcalls := run(30)
	acc, al, acalls := run(8)
	if math.Abs(float64(wl-al)) > 1e-6 {
		t.Fatalf("loss %v in micro-batches, %v at once", al, wl)
	}
	if wcalls == 0 || acalls != wcalls {
		t.Fatalf("ready called %d times with micro-batches, %d at once: want the same (the last pass only)", acalls, wcalls)
	}
	var maxDiff, maxAbs float64
	for i, g := range whole.Grads() {
		maxDiff = math.Max(maxDiff, math.Abs(float64(g-acc.Grads()[i])))
		maxAbs = math.Max(maxAbs, math.Abs(float64(g)))
	}
	if maxDiff > 1e-5*maxAbs {
		t.Fatalf("accumulated gradient differs from the whole batch's by %g (largest %g)", maxDiff, maxAbs)
	}
	if got, err := forwardBackward(whole, obj, nil, 8, nil, nil, 0, 1, nil, nil); got != 0 || err != nil {
		t.Fatalf("empty batch: loss %v", got)
	}
}
