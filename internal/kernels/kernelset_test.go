package kernels

import (
	"slices"
	"testing"
)

func TestKernelSet(t *testing.T) {
	got := KernelSet()
	t.Logf("kernel set %q, GEMM backend %q", got, Backend())
	if !slices.Contains([]string{"avx512+bf16", "avx512", "avx2+fma", "avx2", "go"}, got) {
		t.Errorf("KernelSet() = %q, not one of the documented names", got)
	}
	// Switching the vector code off, as the tests do, is reported.
	defer func(a, b, c, d bool) { gemmBF16AVX512, halfBF16AVX512, halfAVX512, winoSIMD = a, b, c, d }(gemmBF16AVX512, halfBF16AVX512, halfAVX512, winoSIMD)
	gemmBF16AVX512, halfBF16AVX512, halfAVX512, winoSIMD = false, false, false, false
	if got := KernelSet(); got != "go" {
		t.Errorf("with the vector kernels off, KernelSet() = %q, want go", got)
	}
}
