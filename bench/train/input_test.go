package train

import (
	"context"
	"testing"
)

// TestTrainInput builds the network for the given input and classes
// (CIFAR-100's 3×32×32 and 100 outputs, 300 outputs past a byte's labels)
// and reports it; negative sizes are errors.
func TestTrainInput(t *testing.T) {
	for _, c := range []struct {
		opt  Options
		want string
	}{
		{Options{Model: "mlp", BatchSize: 2, Seconds: 0.01}, "1x28x28/10"},
		{Options{Model: "resnet8", BatchSize: 2, Seconds: 0.01, Channels: 3, Height: 32, Width: 32, Classes: 100}, "3x32x32/100"},
		{Options{Model: "mlp", BatchSize: 2, Seconds: 0.01, Channels: 3, Height: 8, Width: 8, Classes: 300}, "3x8x8/300"},
	} {
		res, err := Run(context.Background(), c.opt)
		if err != nil {
			t.Fatal(err)
		}
		if res.Input != c.want || res.Steps < 1 {
			t.Errorf("%s: input %q after %d steps, want %q", c.opt.Model, res.Input, res.Steps, c.want)
		}
	}
	if _, err := Run(context.Background(), Options{Model: "mlp", Channels: -3}); err == nil {
		t.Error("a negative channel count: no error")
	}
}
