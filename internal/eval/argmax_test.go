package eval

import (
	"strings"
	"testing"
)

// Moved from models/loss_test.go with Argmax.
func TestArgmax(t *testing.T) {
	dst := make([]int, 3)
	Argmax([]float32{1, 3, 2, 5, 5, 0, -1, -2, -0.5}, 3, dst)
	if dst[0] != 1 || dst[1] != 0 || dst[2] != 2 {
		t.Fatalf("Argmax = %v, want [1 0 2] (first index on ties)", dst)
	}
}

func TestArgmaxPanics(t *testing.T) {
	defer func() {
		if s, _ := recover().(string); !strings.HasPrefix(s, "eval: ") {
			t.Fatalf("recovered %q, want a panic starting with \"eval: \"", s)
		}
	}()
	Argmax([]float32{0, 0, 0}, 2, make([]int, 2))
}
