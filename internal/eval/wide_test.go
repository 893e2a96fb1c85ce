package eval

import (
	"testing"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/models"
)

// TestMultiDigitEndToEnd runs one multi-label step through every
// architecture on 1×28×56 inputs: a MultiDigit batch, a forward pass, BCE
// with logits, a backward pass and the multi-label metrics.
func TestMultiDigitEndToEnd(t *testing.T) {
	train, _, err := data.Synthetic(40, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := data.MultiDigit(train, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	idx := []int{0, 1, 2, 3, 4, 5, 6, 7}
	x, y := make([]float32, len(idx)*m.ImageSize()), make([]float32, len(idx)*m.Classes)
	m.Batch(idx, x, y)
	for _, name := range models.Names() {
		t.Run(name, func(t *testing.T) {
			net, err := models.New(name, models.Options{Channels: m.C, Height: m.H, Width: m.W, Classes: m.Classes})
			if err != nil {
				t.Fatalf("does not build on %d×%d×%d: %v", m.C, m.H, m.W, err)
			}
			logits := net.Forward(x, len(idx), true)
			d := make([]float32, len(logits))
			loss := models.BCEWithLogits(logits, y, nil, d)
			net.Backward(d)
			ml := NewMultiLabel(m.Classes)
			ml.Add(logits, y)
			t.Logf("%d params, loss %.4f, micro F1 %.3f, mAP %.3f", net.NumParams(), loss, ml.MicroF1(), ml.MAP())
		})
	}
}
