//go:build amd64

package kernels

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestKernelSetFollowsCPU checks KernelSet against the CPU's features.
func TestKernelSetFollowsCPU(t *testing.T) {
	x := cpu.X86
	want := "go"
	switch {
	case x.HasAVX512BF16 && x.HasAVX512BW && x.HasAVX512DQ:
		want = "avx512+bf16"
	case x.HasAVX512F && x.HasAVX512BW:
		want = "avx512"
	case x.HasAVX2 && x.HasFMA:
		want = "avx2+fma"
	case x.HasAVX2:
		want = "avx2"
	}
	if got := KernelSet(); got != want {
		t.Errorf("KernelSet() = %q on a CPU with %+v, want %q", got, x, want)
	}
}
