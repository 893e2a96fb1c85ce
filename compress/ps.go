package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/gradsync/gradsync/models"
)

// Compressed pushes to a parameter server (ps mode). The server owns the
// parameters and the optimiser; each rank pushes its gradient of a step
// encoded as its job's compression says, and the server decodes while it
// sums (in float32), then averages:
//
//   - fp16/bf16: PSF16/PSBF16 frames, two bytes per element, rounded
//     to nearest even as in ring mode (F32ToF16, F32ToBF16).
//   - int8: PSInt8 frames, one byte per element and one float32 scale
//     per DefaultInt8Chunk elements (PSFrame.Scales), with the
//     stochastic rounding of ring mode seeded per (seed, rank, step).
//   - top-k: PSSparse frames of (index, value) pairs of the k
//     largest magnitudes of gradient + residual (error feedback kept by
//     the rank); the server scatter-adds them.
//   - PowerSGD: two pushes per step (phases 1 and 2, see PSPhase); the
//     server sums the P_i and orthogonalises their sum (the same float64
//     Gram–Schmidt as ring mode), the ranks answer with Q_i = M_iᵀ·P, the
//     server averages Q and forms P·Qᵀ (psLowRank: a fixed-order float64
//     product, so the ranks compute the same float32 values for their
//     error feedback), and sends Q with the parameters for warm start.
//
// Steps before the scheme's start_iter push plain float32 (phase 0).
// PSPusher is a rank's half, PSReceiver the server's; both derive the same
// plan (PSPhases) from the spec and the model's segments. The frames are
// this package's PSFrame: the encoded bytes and the tags the encoding
// decides; the ps protocol (paramserver/psstep) maps them to and from the
// wire's TensorFrames and adds the job's tags.

// Compression state in a checkpoint's extra tensors, as the flat buffers
// of Flat (the layout follows from the spec, which the checkpoint's spec
// hash pins), in ring and ps mode alike: CheckpointShared is the state
// every rank shares (PowerSGD's Q), present once set; CheckpointOwn(r)
// rank r's own (error-feedback residuals).
const CheckpointShared = "compress.shared"

// CheckpointOwn names rank's own state in a checkpoint.
func CheckpointOwn(rank int) string { return "compress.rank" + strconv.Itoa(rank) + ".own" }

// PSFrameElems is how many gradient elements one pushed frame covers
// (internal/wire's DefaultFrameElems, 1 MiB of float32): a multiple of
// DefaultInt8Chunk, so that int8 chunks never straddle frames.
const PSFrameElems = 1 << 18

// PSEncoding is how the values of a push travel.
type PSEncoding uint8

const (
	// PSF32 is little-endian float32, 4 bytes per element.
	PSF32 PSEncoding = iota
	// PSF16 is little-endian IEEE half precision, 2 bytes per element.
	PSF16
	// PSBF16 is little-endian bfloat16, 2 bytes per element.
	PSBF16
	// PSInt8 is one byte per element and one float32 scale per
	// PSFrame.ScaleChunk elements.
	PSInt8
	// PSSparse is (uint32 index, float32 value) little-endian pairs,
	// indices relative to the frame's offset, ascending, below its span.
	PSSparse
)

func (e PSEncoding) String() string {
	switch e {
	case PSF32:
		return "f32"
	case PSF16:
		return "f16"
	case PSBF16:
		return "bf16"
	case PSInt8:
		return "int8"
	case PSSparse:
		return "sparse-f32"
	}
	return "PSEncoding(" + strconv.Itoa(int(e)) + ")"
}

// PSPhase is what one push of a step carries.
type PSPhase struct {
	// Phase tags the frames: 0 for a step's only push, 1 and 2 for
	// PowerSGD's.
	Phase uint32
	// Encoding is the frames' encoding.
	Encoding PSEncoding
	// Total is the length in elements of the message the push sums: the
	// gradient for phase 0, PowerSGD's P and uncompressed tensors (phase
	// 1) or Q (phase 2).
	Total int
}

// psPlan is what both halves know of a job's compressed pushes.
type psPlan struct {
	sc     Scheme // resolved
	segs   []models.Segment
	total  int
	layout psgdLayout // powersgd
}

func newPSPlan(sc Scheme, segs []models.Segment) (*psPlan, error) {
	total, err := checkSegments(segs)
	if err != nil {
		return nil, err
	}
	sc, err = sc.resolve()
	if err != nil {
		return nil, err
	}
	p := &psPlan{sc: sc, segs: segs, total: total}
	switch sc.Type {
	case "powersgd":
		if err := p.sc.PowerSGD.resolve(); err != nil {
			return nil, err
		}
		p.layout = newPSGDLayout(segs, p.sc.PowerSGD.Rank, p.sc.PowerSGD.MinCompressionRate)
	case "topk":
		if _, err := p.sc.TopK.resolve(segs); err != nil {
			return nil, err
		}
	case "int8":
		if _, err := p.sc.Int8.resolve(segs); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// phases returns the pushes of step.
func (p *psPlan) phases(step int64) []PSPhase {
	if p.sc.Type == "none" || step < p.sc.start() {
		return []PSPhase{{Encoding: PSF32, Total: p.total}}
	}
	switch p.sc.Type {
	case "powersgd":
		l := &p.layout
		return []PSPhase{{Phase: 1, Encoding: PSF32, Total: l.nP + l.nU}, {Phase: 2, Encoding: PSF32, Total: l.nQ}}
	case "topk":
		return []PSPhase{{Encoding: PSSparse, Total: p.total}}
	case "int8":
		return []PSPhase{{Encoding: PSInt8, Total: p.total}}
	case "fp16":
		return []PSPhase{{Encoding: PSF16, Total: p.total}}
	case "bf16":
		return []PSPhase{{Encoding: PSBF16, Total: p.total}}
	}
	panic("compress: unknown scheme " + p.sc.Type)
}

// PSReceiver is the parameter server's half of a job's compressed pushes:
// it decodes frames into sums and, for PowerSGD, turns the summed factors
// into P to send back and finally into the averaged gradient. It is a
// pure core; the caller serialises calls.
type PSReceiver struct {
	plan  *psPlan
	world int
	inv   float32

	pu      []float32 // powersgd: this step's orthogonalised P, then the summed uncompressed tensors
	q       []float32 // powersgd: the last averaged Q (the ranks' warm start)
	qSet    bool
	scratch []float64
}

// NewPSReceiver builds the server's half for a job of world ranks whose
// gradient is laid out as segs.
func NewPSReceiver(sc Scheme, segs []models.Segment, world int) (*PSReceiver, error) {
	if world < 1 {
		return nil, fmt.Errorf("compress: world size %d: want ≥ 1", world)
	}
	plan, err := newPSPlan(sc, segs) // the seeds only matter to the ranks
	if err != nil {
		return nil, err
	}
	r := &PSReceiver{plan: plan, world: world, inv: 1 / float32(world)}
	if plan.sc.Type == "powersgd" {
		l := &plan.layout
		r.pu = make([]float32, l.nP+l.nU)
		r.q = make([]float32, l.nQ)
		r.scratch = make([]float64, l.maxScratch)
	}
	return r, nil
}

// Phases returns the pushes of step: one, or PowerSGD's two.
func (r *PSReceiver) Phases(step int64) []PSPhase { return r.plan.phases(step) }

// Type is the compression type ("none", "powersgd", …).
func (r *PSReceiver) Type() string { return r.plan.sc.Type }

// DecodeAdd adds the values a frame of ph carries to dst, the element
// range the frame covers (as the protocol checked it: the data's length
// over the element size for dense encodings, the frame's span for
// PSSparse): data, and for PSInt8 scales (little-endian float32) with
// one scale per scaleChunk elements. Anything malformed is an error;
// nothing from the frame is trusted.
func (r *PSReceiver) DecodeAdd(dst []float32, data, scales []byte, scaleChunk int, ph PSPhase) error {
	switch ph.Encoding {
	case PSF32:
		return addF32LE(dst, data)
	case PSF16:
		return AddHalf(dst, data, FP16)
	case PSBF16:
		return AddHalf(dst, data, BF16)
	case PSInt8:
		return DequantizeInt8Add(dst, data, scales, scaleChunk)
	case PSSparse:
		return AddSparse(dst, data)
	}
	return fmt.Errorf("compress: encoding %v cannot be decoded", ph.Encoding)
}

// CombineP takes the sum over ranks of PowerSGD's phase-1 messages (every
// P_i, then the uncompressed tensors), orthogonalises each matrix's P and
// returns the P to send to every rank (valid until the next CombineP).
func (r *PSReceiver) CombineP(sum []float32) []float32 {
	l := &r.plan.layout
	copy(r.pu, sum)
	for i := range l.mats {
		m := &l.mats[i]
		orthogonalize(r.pu[m.pOff:m.pOff+m.rows*m.rank], m.rows, m.rank, r.plan.sc.PowerSGD.Epsilon, r.scratch)
	}
	return r.pu[:l.nP]
}

// CombineQ takes the sum over ranks of PowerSGD's phase-2 messages (every
// Q_i), averages it into the Q it returns (to send to every rank with the
// parameters; valid until the next CombineQ), and writes the averaged
// gradient into grad: P·Qᵀ for the compressed matrices, the averaged
// uncompressed tensors elsewhere.
func (r *PSReceiver) CombineQ(sum, grad []float32) []float32 {
	l := &r.plan.layout
	for i, v := range sum[:l.nQ] {
		r.q[i] = v * r.inv
	}
	r.qSet = true
	for i := range l.mats {
		m := &l.mats[i]
		psLowRank(grad[m.off:m.off+m.rows*m.cols], r.pu[m.pOff:m.pOff+m.rows*m.rank], r.q[m.qOff:m.qOff+m.cols*m.rank], m)
	}
	u := r.pu[l.nP:]
	segs := r.plan.segs
	for _, i := range l.flat {
		s := segs[i]
		g := grad[s.Offset : s.Offset+s.Len]
		copy(g, u)
		scale(g, r.inv)
		u = u[s.Len:]
	}
	return r.q
}

// Shared returns the state every rank shares after the last compressed
// step (PowerSGD's warm-start Q, as Flat.Shared), or nil when there is none.
func (r *PSReceiver) Shared() []float32 {
	if !r.qSet || r.plan.sc.PowerSGD.NoWarmStart {
		return nil
	}
	return r.q
}

// SetShared restores the shared state a checkpoint holds (see Shared).
func (r *PSReceiver) SetShared(q []float32) error {
	if r.plan.sc.Type != "powersgd" || r.plan.sc.PowerSGD.NoWarmStart || len(q) != len(r.q) {
		return fmt.Errorf("compress: %d shared values; this job's compression keeps %d", len(q), len(r.Shared()))
	}
	copy(r.q, q)
	r.qSet = true
	return nil
}

// OwnLen is the length of a rank's own state (error feedback), which a
// checkpoint gathers from every rank; 0 when there is none.
func (r *PSReceiver) OwnLen() int {
	switch sc := &r.plan.sc; {
	case sc.Type == "topk" && !sc.TopK.NoErrorFeedback:
		return r.plan.total
	case sc.Type == "powersgd" && !sc.PowerSGD.NoErrorFeedback:
		return r.plan.layout.nE
	}
	return 0
}

// psLowRank sets g (rows×cols) = pm (rows×r) · qᵀ (r×cols) in a fixed
// order with float64 accumulation of exact products, so that the server
// and every rank compute the same float32 values on any machine (no GEMM
// backend, no fused multiply-add can change them).
func psLowRank(g, pm, q []float32, m *matrix) {
	r := m.rank
	for i := range m.rows {
		pi := pm[i*r : (i+1)*r]
		gi := g[i*m.cols : (i+1)*m.cols]
		for j := range gi {
			qj := q[j*r : (j+1)*r]
			var acc float64
			for k, v := range pi {
				acc += float64(v) * float64(qj[k])
			}
			gi[j] = float32(acc)
		}
	}
}

// EncodeHalf writes src as little-endian 16-bit values of format f into
// dst (2·len(src) bytes) and returns it; rounding as Cast's.
func EncodeHalf(dst []byte, src []float32, f Format) []byte {
	dst = dst[:2*len(src)]
	if f == FP16 {
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	} else {
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	}
	return dst
}

// AddHalf adds little-endian 16-bit values of format f to dst; len(src)
// must be 2·len(dst).
func AddHalf(dst []float32, src []byte, f Format) error {
	if len(src) != 2*len(dst) {
		return fmt.Errorf("compress: %d bytes for %d %v values (want %d)", len(src), len(dst), f, 2*len(dst))
	}
	if f == FP16 {
		for i := range dst {
			dst[i] += F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	} else {
		for i := range dst {
			dst[i] += BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
	return nil
}

// AddSparse scatter-adds (uint32 index, float32 value) little-endian pairs
// to dst; indices must be strictly ascending and below len(dst).
func AddSparse(dst []float32, src []byte) error {
	if len(src)%8 != 0 {
		return fmt.Errorf("compress: %d bytes of sparse pairs, not a multiple of 8", len(src))
	}
	next := uint64(0) // the smallest index allowed next
	for i := 0; i < len(src); i += 8 {
		j := uint64(binary.LittleEndian.Uint32(src[i:]))
		if j < next || j >= uint64(len(dst)) {
			return fmt.Errorf("compress: sparse pair %d: index %d not ascending or outside [0,%d)", i/8, j, len(dst))
		}
		dst[j] += math.Float32frombits(binary.LittleEndian.Uint32(src[i+4:]))
		next = j + 1
	}
	return nil
}

// putF32LE writes src as little-endian float32 into dst, which must hold
// 4*len(src) bytes, and returns dst[:4*len(src)].
func putF32LE(dst []byte, src []float32) []byte {
	dst = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return dst
}

// addF32LE adds little-endian float32 bytes into dst; len(src) must be
// 4*len(dst).
func addF32LE(dst []float32, src []byte) error {
	if len(src) != 4*len(dst) {
		return fmt.Errorf("compress: %d data bytes for %d float32 values (want %d)", len(src), len(dst), 4*len(dst))
	}
	for i := range dst {
		dst[i] += math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return nil
}
