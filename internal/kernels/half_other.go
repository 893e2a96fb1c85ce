//go:build !amd64

package kernels

// Without assembly kernels every conversion runs the Go code.

func narrowBF16SIMD([]BF16, []float32) int { return 0 }
func widenBF16SIMD([]float32, []BF16) int  { return 0 }
func narrowFP16SIMD([]FP16, []float32) int { return 0 }
func widenFP16SIMD([]float32, []FP16) int  { return 0 }

// The kernel switches of half_amd64.go, so that the tests that flip them
// build everywhere.
var halfBF16AVX512, halfAVX512, halfF16C bool
