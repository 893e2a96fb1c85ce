//go:build (linux || darwin || freebsd) && (amd64 || arm64)

package kernels

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/cpu"
)

// openBLASNames are tried in order by dlopen.
var openBLASNames = []string{"libopenblas.so.0", "libopenblas.so", "libopenblas.0.dylib", "libopenblas.dylib"}

// openBLAS calls the Fortran-ABI sgemm_ of a libopenblas loaded at run time.
//
// Why sgemm_ and not cblas_sgemm: every argument of sgemm_ is a pointer, so
// it goes through purego.SyscallN without allocating, whereas a
// RegisterLibFunc wrapper (needed for cblas_sgemm's float arguments) costs
// about 12 allocations per call, and the models must not allocate per step.
// sgemm_ is column-major; Gemm's row-major product is computed as the
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, which reads the same memory.
type openBLAS struct {
	sgemm      uintptr // address of sgemm_
	setThreads func(int32)
}

// sgemmArgs holds the scalars sgemm_ takes by pointer. They live in pooled
// heap objects so that their addresses are stable during the call and no
// call allocates.
type sgemmArgs struct {
	transA, transB byte
	m, n, k        int32 // blasint is 32-bit in the LP64 builds Debian ships
	lda, ldb, ldc  int32
	alpha, beta    float32
	args           [13]uintptr // sgemm_'s arguments, all addresses
}

var sgemmArgsPool = sync.Pool{New: func() any { return new(sgemmArgs) }}

var (
	openBLASOnce sync.Once
	openBLASImpl *openBLAS
	openBLASErr  error
)

// loadOpenBLAS loads the library once and pins it to one thread.
func loadOpenBLAS() (*openBLAS, error) {
	openBLASOnce.Do(func() {
		defer pinCoreType()()
		var lib uintptr
		var errs []error
		for _, name := range openBLASNames {
			h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
			if err == nil {
				lib = h
				break
			}
			errs = append(errs, err)
		}
		if lib == 0 {
			openBLASErr = fmt.Errorf("kernels: cannot load OpenBLAS: %w", errors.Join(errs...))
			return
		}
		sgemm, err := purego.Dlsym(lib, "sgemm_")
		if err == nil {
			_, err = purego.Dlsym(lib, "openblas_set_num_threads")
		}
		if err != nil {
			openBLASErr = fmt.Errorf("kernels: loaded library is not OpenBLAS: %w", err)
			return
		}
		ob := &openBLAS{sgemm: sgemm}
		purego.RegisterLibFunc(&ob.setThreads, lib, "openblas_set_num_threads")
		ob.setThreads(1) // one BLAS thread per worker: see anchors/GO_DEPS.md §4
		openBLASImpl = ob
	})
	return openBLASImpl, openBLASErr
}

// pinCoreType sets OPENBLAS_CORETYPE for the duration of the dlopen when
// the user has not set it, and returns the function that restores it.
//
// Why: OpenBLAS's dynamic-arch build picks its kernels from the CPU model,
// and on VMs that mask the model it falls back to "Prescott" (SSE3), which
// measured 3–4× slower here than its AVX-512 ("SkylakeX") or AVX2
// ("Haswell") kernels on the same machine. Choosing from the feature flags
// is always correct; an explicit OPENBLAS_CORETYPE (CI presets Haswell)
// wins. The library reads the variable only in its constructor, so it is
// restored right after loading.
func pinCoreType() (restore func()) {
	const key = "OPENBLAS_CORETYPE"
	if _, set := os.LookupEnv(key); set {
		return func() {}
	}
	var core string
	switch x := cpu.X86; {
	case x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ:
		core = "SkylakeX"
	case x.HasAVX2 && x.HasFMA:
		core = "Haswell"
	default:
		return func() {}
	}
	if os.Setenv(key, core) != nil {
		return func() {}
	}
	return func() { os.Unsetenv(key) }
}

func (*openBLAS) name() string { return "openblas" }

func (o *openBLAS) threads(n int) { o.setThreads(int32(n)) }

func (o *openBLAS) gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for _, v := range [...]int{m, n, k, lda, ldb, ldc} {
		if v > math.MaxInt32 {
			panic(fmt.Sprintf("kernels: Gemm: size %d overflows OpenBLAS's 32-bit blasint", v))
		}
	}
	p := sgemmArgsPool.Get().(*sgemmArgs)
	*p = sgemmArgs{
		transA: fortranTrans(transB), transB: fortranTrans(transA),
		m: int32(n), n: int32(m), k: int32(k),
		lda: int32(ldb), ldb: int32(lda), ldc: int32(ldc),
		alpha: alpha, beta: beta,
	}
	// The argument array is built before the call, outside SyscallN's
	// uintptrescapes expression (which would allocate the variadic slice on
	// every call). This is safe because every address is of a heap object:
	// p is pooled, and a, b, c escape through the gemmer interface call in
	// Gemm; Go's collector does not move heap objects, and KeepAlive keeps
	// them reachable until sgemm_ returns.
	p.args = [13]uintptr{
		uintptr(unsafe.Pointer(&p.transA)), uintptr(unsafe.Pointer(&p.transB)),
		uintptr(unsafe.Pointer(&p.m)), uintptr(unsafe.Pointer(&p.n)), uintptr(unsafe.Pointer(&p.k)),
		uintptr(unsafe.Pointer(&p.alpha)),
		uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(&p.lda)),
		uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(&p.ldb)),
		uintptr(unsafe.Pointer(&p.beta)),
		uintptr(unsafe.Pointer(unsafe.SliceData(c))), uintptr(unsafe.Pointer(&p.ldc)),
	}
	purego.SyscallN(o.sgemm, p.args[:]...)
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
	runtime.KeepAlive(p)
	sgemmArgsPool.Put(p)
}

func fortranTrans(t bool) byte {
	if t {
		return 'T'
	}
	return 'N'
}
