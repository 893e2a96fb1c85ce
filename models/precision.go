package models

import (
	"fmt"
	"strings"

	"github.com/gradsync/gradsync/internal/kernels"
)

// Mixed precision (torch.autocast semantics on the engine): with bf16 or
// fp16 the matrix products of linear layers and convolutions take their
// operands — inputs, weights and, in Backward, output gradients — in the
// low precision and accumulate in float32; everything else (biases,
// activations, softmax, losses, norms, pools, reductions, the attention
// scores) stays in float32, and so do the master weights, the gradient
// buffer and the optimiser, which see float32 only. A product of two
// bf16 or two fp16 values is exact in float32, so the only roundings
// are the operands' (to nearest even) and the float32 sums'.
//
// bf16 runs kernels.GemmBF16 (VDPBF16PS) where the CPU has AVX512-BF16,
// and elsewhere the float32 GEMM on operands rounded to bf16: the same
// products, summed in another order. fp16 runs the float32 GEMM on
// operands rounded to fp16 (values beyond ±65504 become ±Inf, which is
// what a loss scaler detects). Two paths keep float32 operands: the
// direct convolution over few input channels (kernels.ConvSmall, a
// network's first convolution; its cost is small) and the attention's
// query·key and weight·value products, which run in Go.

// Precision is the arithmetic of a network's matrix products.
type Precision int

// The precisions.
const (
	FP32 Precision = iota // float32 throughout (the default)
	BF16                  // bfloat16 operands, float32 accumulation
	FP16                  // IEEE half operands, float32 accumulation
)

var precisionNames = []string{"fp32", "bf16", "fp16"}

// String returns the precision's name as ParsePrecision accepts it.
func (p Precision) String() string {
	if p < 0 || int(p) >= len(precisionNames) {
		return fmt.Sprintf("Precision(%d)", int(p))
	}
	return precisionNames[p]
}

// ParsePrecision maps a spec's precision ("", fp32, bf16, fp16) to its
// value.
func ParsePrecision(s string) (Precision, error) {
	if s == "" {
		return FP32, nil
	}
	for i, n := range precisionNames {
		if s == n {
			return Precision(i), nil
		}
	}
	return 0, fmt.Errorf("models: unknown precision %q (want %s)", s, strings.Join(precisionNames, ", "))
}

// SetPrecision selects the arithmetic of the following steps (default
// FP32, which is bit for bit the network without this setting). It must
// not be called during a step.
func (n *Network) SetPrecision(p Precision) error {
	if p < FP32 || p > FP16 {
		return fmt.Errorf("models: %s: unknown precision %d", n.name, int(p))
	}
	n.prec = p
	setPrecision(n.layers, p)
	for _, r := range n.reps {
		setPrecision(r.layers, p)
	}
	return nil
}

// Precision reports the precision set by SetPrecision.
func (n *Network) Precision() Precision { return n.prec }

// setPrecision sets p on every layer with matrix products in layers.
func setPrecision(layers []Layer, p Precision) {
	for _, l := range nestedLayers(layers) {
		switch l := l.(type) {
		case *Linear:
			l.lp.prec = p
		case *Conv2D:
			l.lp.prec = p
		}
	}
}

// bf16Native: GemmBF16 runs the CPU's BF16 dot-product instructions.
var bf16Native = kernels.KernelSet() == "avx512+bf16"

// lowp is a layer's matrix product in its precision, with the scratch
// that holds the rounded operands (owned by the layer, reused: warm steps
// do not allocate).
type lowp struct {
	prec     Precision
	ah, bh   []kernels.BF16 // bf16 operands for GemmBF16
	fh       []kernels.FP16 // fp16 staging
	af, bf   []float32      // operands rounded to the precision, as float32
	rounding bool           // test hook: take the rounded-float32 path even with GemmBF16 native
}

// gemm is kernels.Gemm (same arguments) with a and b rounded to l's
// precision; in FP32 it is kernels.Gemm itself.
func (l *lowp) gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if l.prec == FP32 || m == 0 || n == 0 || k == 0 {
		kernels.Gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	a = a[:operandLen(transA, m, k, lda)]
	b = b[:operandLen(transB, k, n, ldb)]
	if l.prec == BF16 && bf16Native && !l.rounding {
		l.ah = growBF16(l.ah, len(a))
		l.bh = growBF16(l.bh, len(b))
		kernels.NarrowBF16(l.ah, a)
		kernels.NarrowBF16(l.bh, b)
		kernels.GemmBF16(transA, transB, m, n, k, alpha, l.ah, lda, l.bh, ldb, beta, c, ldc)
		return
	}
	l.af = grow(l.af, len(a))
	l.bf = grow(l.bf, len(b))
	l.round(l.af, a)
	l.round(l.bf, b)
	kernels.Gemm(transA, transB, m, n, k, alpha, l.af, lda, l.bf, ldb, beta, c, ldc)
}

// round sets dst to src rounded to l's precision (to nearest even).
func (l *lowp) round(dst, src []float32) {
	if l.prec == BF16 {
		l.ah = growBF16(l.ah, len(src))
		kernels.NarrowBF16(l.ah, src)
		kernels.WidenBF16(dst, l.ah)
		return
	}
	if cap(l.fh) < len(src) {
		l.fh = make([]kernels.FP16, len(src))
	}
	l.fh = l.fh[:len(src)]
	kernels.NarrowFP16(l.fh, src)
	kernels.WidenFP16(dst, l.fh)
}

// operandLen is the extent of a GEMM operand op(x) of r×c with leading
// dimension ld: the elements from the first to the last one read.
func operandLen(trans bool, r, c, ld int) int {
	if trans {
		r, c = c, r
	}
	return (r-1)*ld + c
}

func growBF16(buf []kernels.BF16, n int) []kernels.BF16 {
	if cap(buf) < n {
		return make([]kernels.BF16, n)
	}
	return buf[:n]
}
