package kernels

// KernelSet names the widest vector kernels this process runs, from the
// CPU features detected at start-up (each fast path is chosen at run time
// and falls back to the Go code):
//
//   - "avx512+bf16": AVX512-BF16 (GemmBF16's VDPBF16PS kernel and
//     VCVTNEPS2BF16 conversions), with the AVX-512 fp16 conversions and
//     the AVX2 ones below;
//   - "avx512": AVX-512 conversions, the AVX2 kernels, GemmBF16 in Go;
//   - with either of those two, the AVX-512 depthwise kernels (3×3,
//     padding 1, stride 1 or 2: depthwise_fast.go), batch-norm
//     kernels (bnorm.go) and GemmChain (gemm_chain.go), which need only
//     AVX512F;
//   - "avx2+fma": the AVX2/FMA convolution and Winograd kernels and F16C
//     conversions;
//   - "avx2": the AVX2 Winograd kernels without the FMA ones;
//   - "go": the Go code everywhere.
//
// The float32 Gemm is not included: Backend says which library runs it
// (OpenBLAS picks its own kernels for the CPU). The engine logs this at
// start-up, so that a run's speed can be read against the kernels it had.
func KernelSet() string {
	switch {
	case gemmBF16AVX512 && halfBF16AVX512:
		return "avx512+bf16"
	case halfAVX512:
		return "avx512"
	case convSmallSIMD && winoSIMD:
		return "avx2+fma"
	case winoSIMD:
		return "avx2"
	}
	return "go"
}
