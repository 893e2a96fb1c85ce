package kernels

import (
	"fmt"
	"os"
	"sync/atomic"
)

// gemmer is one GEMM implementation. Arguments have already been checked
// by Gemm, and m, n, k > 0 and alpha != 0.
type gemmer interface {
	name() string
	gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
}

// current is the backend Gemm dispatches to. It is an atomic pointer so that
// SetBackend may race with running kernels without a data race; a kernel
// already running finishes on the backend it started with.
var current atomic.Pointer[gemmer]

// envBLAS names the environment variable read at init.
const envBLAS = "GRADSYNC_BLAS"

func init() {
	choice := os.Getenv(envBLAS)
	if choice == "" {
		choice = "auto"
	}
	if err := SetBackend(choice); err != nil {
		// A library init cannot return an error; fall back to what works
		// and say why once, rather than crash every binary that imports us.
		fmt.Fprintf(os.Stderr, "%v (from %s); using auto selection\n", err, envBLAS)
		if err := SetBackend("auto"); err != nil {
			panic("kernels: " + err.Error())
		}
	}
}

// Backend reports the GEMM backend in use: "openblas" or "gonum".
func Backend() string { return (*current.Load()).name() }

// SetBackend selects the GEMM backend: "openblas" (error if the library
// cannot be loaded), "gonum", or "auto" (OpenBLAS if it loads, else gonum).
// It is safe to call concurrently with Gemm.
func SetBackend(name string) error {
	var g gemmer
	switch name {
	case "gonum":
		g = gonumGemm{}
	case "openblas":
		ob, err := loadOpenBLAS()
		if err != nil {
			return err
		}
		g = ob
	case "auto":
		if ob, err := loadOpenBLAS(); err == nil {
			g = ob
		} else {
			g = gonumGemm{}
		}
	default:
		return fmt.Errorf("kernels: unknown BLAS backend %q (want auto, openblas or gonum)", name)
	}
	current.Store(&g)
	return nil
}

// threadsSet is the thread count last given to SetThreads (0: never).
var threadsSet atomic.Int64

// SetThreads sets how many threads OpenBLAS uses for each Gemm call
// (openblas_set_num_threads); n < 1 means 1. The default is 1: each worker
// owns one core. It loads OpenBLAS if it can, whichever backend is
// selected, so a later switch to OpenBLAS keeps the setting; the gonum
// backend ignores it (gonum splits large products over GOMAXPROCS
// goroutines on its own). Call it between steps, not during a Gemm.
func SetThreads(n int) {
	n = max(n, 1)
	threadsSet.Store(int64(n))
	if ob, err := loadOpenBLAS(); err == nil {
		ob.threads(n)
	}
}

// Threads reports the thread count set by SetThreads (1 by default).
func Threads() int { return int(max(threadsSet.Load(), 1)) }

// Gemm computes c = alpha·op(a)·op(b) + beta·c on row-major matrices, where
// op(x) is x or xᵀ as transA/transB say. op(a) is (m,k), op(b) is (k,n) and
// c is (m,n); a is stored as (m,k) with row stride lda, or as (k,m) when
// transA; b likewise as (k,n) or (n,k) with stride ldb; c has stride ldc.
// As in BLAS, beta == 0 overwrites c without reading it (NaNs in c do not
// propagate). Gemm reads a and b and writes only c; it keeps no references.
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemmShapes("Gemm", transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scale(c, m, n, ldc, beta)
		return
	}
	(*current.Load()).gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// checkGemmShapes panics unless the sizes are not negative and slices of
// lengths la, lb and lc can hold op(a) (m,k), op(b) (k,n) and c (m,n) with
// their strides, as the GEMMs of every element type take them; fn names
// the caller in the message.
func checkGemmShapes(fn string, transA, transB bool, m, n, k, la, lda, lb, ldb, lc, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: %s: negative size m=%d n=%d k=%d", fn, m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkMatrixLen(fn, "a", la, ar, ac, lda)
	checkMatrixLen(fn, "b", lb, br, bc, ldb)
	checkMatrixLen(fn, "c", lc, m, n, ldc)
}

// checkMatrixLen panics unless a slice of length l can hold a rows×cols
// row-major matrix with row stride ld.
func checkMatrixLen(fn, what string, l, rows, cols, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("kernels: %s: ld%s=%d < max(1, %d columns)", fn, what, ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; l < need {
		panic(fmt.Sprintf("kernels: %s: len(%s)=%d < %d for a %d×%d matrix with stride %d", fn, what, l, need, rows, cols, ld))
	}
}

// scale sets c = beta·c, or c = 0 when beta == 0.
func scale(c []float32, m, n, ldc int, beta float32) {
	if beta == 1 {
		return
	}
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}
