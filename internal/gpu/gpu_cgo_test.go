//go:build cgo

package gpu

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

func TestDiscoverMockDGX(t *testing.T) {
	gpus, err := discoverWith(dgxa100.New())
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("found %d GPUs, want 8", len(gpus))
	}
	for i, g := range gpus {
		if int(g.Index) != i || g.Name == "" || g.Uuid == "" || g.MemoryBytes == 0 {
			t.Errorf("gpu %d incomplete: %v", i, g)
		}
	}
}

func TestDiscoverNoDriverCallsNothingElse(t *testing.T) {
	lib := &mock.Interface{
		InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		// Any other call would panic on the mock's nil func: that is the check.
	}
	gpus, err := discoverWith(lib)
	if err != nil || len(gpus) != 0 {
		t.Fatalf("got %v, %v; want no GPUs and no error", gpus, err)
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Fatalf("Init called %d times", n)
	}
}

func TestDiscoverHere(t *testing.T) {
	// On a machine without the NVIDIA driver this must be zero GPUs, no error.
	gpus, err := Discover()
	t.Logf("GPUs here: %d (err %v)", len(gpus), err)
}
