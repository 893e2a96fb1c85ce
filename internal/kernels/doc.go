// Package kernels holds the numeric kernels the models are built on: a
// row-major float32 GEMM with interchangeable backends (OpenBLAS loaded at
// run time through purego, or pure-Go gonum), im2col/col2im for NCHW
// convolutions, the Winograd F(2×2,3×3) transforms (winograd.go) for
// 3×3 stride-1 ones, and direct depthwise convolutions (depthwise.go, with
// AVX-512 kernels for MobileNet's 3×3 ones: depthwise_fast.go).
// Batch norm's float64 lane sums and elementwise passes (bnorm.go).
// GemmChain (gemm_chain.go): an AVX-512 product for convolutions' thin
// shapes whose every element is one multiply-add chain in a fixed order.
// Mixed precision: bf16/fp16 conversions (half.go), GemmBF16, KernelSet.
//
// All slices are plain row-major []float32 owned by the caller; kernels
// write only into their dst (first) argument and never keep references.
// Shape bugs panic with a "kernels: " prefixed message.
//
// The GEMM backend is chosen once at init from the GRADSYNC_BLAS
// environment variable ("auto", "openblas" or "gonum"; default "auto",
// which picks OpenBLAS when libopenblas.so.0 loads and gonum otherwise) and
// can be changed with SetBackend. OpenBLAS runs one thread per call unless
// SetThreads says otherwise: each worker process (or goroutine) is
// expected to own one core.
package kernels
