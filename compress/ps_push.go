package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gradsync/gradsync/models"
)

var _ Stateful = (*PSPusher)(nil)

// PSPusher is a rank's half of its job's compressed pushes: it encodes the
// rank's gradient of each step into frames, answers PowerSGD's P with its
// Q, and keeps the rank's compression state (error feedback, warm-start
// Q), which it exposes as Stateful. It is not safe for concurrent use,
// except Stats.
type PSPusher struct {
	plan *psPlan
	rank int

	topk *TopK     // topk: selection buffers and residual (no ring)
	psgd *PowerSGD // powersgd: factors, residuals and Q (no ring)

	pending bool // a compressed step awaits Applied
	buf     []byte
	scales  []float32
	sent    int64 // bytes of the current step's pushes

	mu    sync.Mutex // guards stats
	stats Stats
}

// NewPSPusher builds rank's half for a gradient laid out as segs; the
// seeds of sc's configs must be the job's, the same on every rank (int8
// rounding and PowerSGD's initial Q derive from them).
func NewPSPusher(sc Scheme, segs []models.Segment, rank int) (*PSPusher, error) {
	plan, err := newPSPlan(sc, segs)
	if err != nil {
		return nil, err
	}
	p := &PSPusher{plan: plan, rank: rank}
	switch plan.sc.Type {
	case "topk":
		p.topk = newTopKCore(plan.total, plan.sc.TopK)
	case "powersgd":
		p.psgd = newPowerSGDCore(segs, plan.total, plan.sc.PowerSGD)
		if p.psgd.work == nil { // without error feedback: M_i, kept for phase 2
			p.psgd.work = make([]float32, p.psgd.nE)
		}
	}
	return p, nil
}

// Phases returns the pushes of step: one, or PowerSGD's two.
func (p *PSPusher) Phases(step int64) []PSPhase { return p.plan.phases(step) }

// Stats returns the cumulative counters (as a ring Reducer's; WireBytes
// is SentBytes: every byte goes to the server once).
func (p *PSPusher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// PSFrame is one frame of a push: the encoded bytes and the tags the
// encoding decides. The sender adds the job's (job, generation, op,
// step, rank) and must not keep the frame after the send returns.
type PSFrame struct {
	Phase    uint32
	Encoding PSEncoding
	// Chunk numbers the frames of a push from 0; Offset is the element
	// offset of the frame in the push's message of Total elements.
	Chunk         uint32
	Offset, Total int
	Last          bool
	// Data holds the encoded values (empty for SendF32); Scales PSInt8's
	// little-endian float32 scales, one per ScaleChunk elements.
	Data, Scales []byte
	ScaleChunk   uint32
	// Span is the number of elements a PSSparse frame covers.
	Span int
}

// PSSender is where a PSPusher's frames go.
type PSSender interface {
	// SendFrame sends an encoded frame.
	SendFrame(f *PSFrame) error
	// SendF32 sends a PSF32 frame: f holds every tag but no data, vals
	// its values (a sub-slice of what the pusher was given). It returns
	// once it no longer needs vals, so a sender may hand them to gRPC
	// without copying them (internal/wire/framecodec) and wait until
	// they are written.
	SendF32(f *PSFrame, vals []float32) error
}

// timedSender wraps a PSSender so that the time spent in it is not
// counted as compression time and the payload bytes are.
type timedSender struct {
	p    *PSPusher
	s    PSSender
	comm *time.Duration
}

func (t timedSender) SendFrame(f *PSFrame) error {
	t.p.sent += int64(len(f.Data) + len(f.Scales))
	t0 := time.Now()
	err := t.s.SendFrame(f)
	*t.comm += time.Since(t0)
	return err
}

func (t timedSender) SendF32(f *PSFrame, vals []float32) error {
	t.p.sent += int64(4 * len(vals))
	t0 := time.Now()
	err := t.s.SendF32(f, vals)
	*t.comm += time.Since(t0)
	return err
}

// psPieces cuts vals, the message of a push of phase, into PSF32 frames
// of at most PSFrameElems values, in order, and hands each to send with
// the values it covers; an empty message is one empty last frame.
func psPieces(phase uint32, vals []float32, send func(*PSFrame, []float32) error) error {
	for off := 0; ; off += PSFrameElems {
		end := min(off+PSFrameElems, len(vals))
		f := &PSFrame{Phase: phase, Encoding: PSF32, Chunk: uint32(off / PSFrameElems), Offset: off, Total: len(vals), Last: end >= len(vals)}
		if err := send(f, vals[off:end]); err != nil {
			return err
		}
		if f.Last {
			return nil
		}
	}
}

func (p *PSPusher) addTime(start time.Time, comm time.Duration) {
	p.mu.Lock()
	p.stats.CompressSeconds += (time.Since(start) - comm).Seconds()
	p.mu.Unlock()
}

// Push sends the first (for all but PowerSGD the only) push of step:
// grads, this rank's gradient, encoded as Phases(step)[0] says, as frames
// through send: float32 frames (no compression, PowerSGD's P) through
// SendF32, whose values are sub-slices of grads (or of the pusher's own
// buffers), the others through SendFrame. grads is not changed.
func (p *PSPusher) Push(step int64, grads []float32, send PSSender) error {
	if len(grads) != p.plan.total {
		panic(fmt.Sprintf("compress: PSPusher.Push: len(grads) = %d, the segments cover %d", len(grads), p.plan.total))
	}
	start := time.Now()
	var comm time.Duration
	defer func() { p.addTime(start, comm) }()
	send = timedSender{p: p, s: send, comm: &comm}
	p.sent = 0
	ph := p.plan.phases(step)[0]
	p.pending = ph.Encoding != PSF32 || ph.Phase != 0
	switch {
	case ph.Phase == 1:
		return p.pushP(step, grads, send)
	case ph.Encoding == PSF32:
		return psPieces(0, grads, send.SendF32)
	case ph.Encoding == PSSparse:
		return p.pushTopK(grads, send)
	}
	var rounder *Int8Rounder
	if ph.Encoding == PSInt8 {
		rounder = NewInt8Rounder(p.plan.sc.Int8.Seed, p.rank, step)
	}
	for off := 0; ; off += PSFrameElems {
		end := min(off+PSFrameElems, len(grads))
		x := grads[off:end]
		f := psFrame(ph, off, len(grads), end >= len(grads))
		switch ph.Encoding {
		case PSF16:
			f.Data = EncodeHalf(p.grow(2*len(x)), x, FP16)
		case PSBF16:
			f.Data = EncodeHalf(p.grow(2*len(x)), x, BF16)
		case PSInt8:
			size := p.plan.sc.Int8.ChunkSize
			n := (len(x) + size - 1) / size
			if cap(p.scales) < n {
				p.scales = make([]float32, n)
			}
			buf := p.grow(len(x) + 4*n)
			rounder.QuantizeInt8(buf[:len(x)], p.scales[:n], x, size)
			f.Data, f.Scales, f.ScaleChunk = buf[:len(x)], putF32LE(buf[len(x):], p.scales[:n]), uint32(size)
		}
		if err := send.SendFrame(f); err != nil {
			return err
		}
		if f.Last {
			return nil
		}
	}
}

// grow returns p.buf resized to n bytes.
func (p *PSPusher) grow(n int) []byte {
	if cap(p.buf) < n {
		p.buf = make([]byte, n)
	}
	return p.buf[:n]
}

// psFrame is a frame of ph covering the message of total elements from
// off.
func psFrame(ph PSPhase, off, total int, last bool) *PSFrame {
	return &PSFrame{Phase: ph.Phase, Encoding: ph.Encoding, Chunk: uint32(off / PSFrameElems), Offset: off, Total: total, Last: last}
}

// pushTopK selects the k largest magnitudes of gradient + residual (the
// residual is kept until Applied) and sends them as sparse frames, one per
// PSFrameElems elements of the gradient.
func (p *PSPusher) pushTopK(grads []float32, send PSSender) error {
	t := p.topk
	w := t.work
	copy(w, grads)
	if t.res != nil {
		add(w, t.res)
	}
	t.idx = selectTopK(t.idx[:0], t.keys, w, t.k)
	ph := PSPhase{Encoding: PSSparse, Total: len(grads)}
	idx := t.idx
	for off := 0; ; off += PSFrameElems {
		end := min(off+PSFrameElems, len(grads))
		n := 0
		for n < len(idx) && int(idx[n]) < end {
			n++
		}
		buf := p.grow(8 * n)
		for i, j := range idx[:n] {
			binary.LittleEndian.PutUint32(buf[8*i:], uint32(int(j)-off))
			binary.LittleEndian.PutUint32(buf[8*i+4:], math.Float32bits(w[j]))
		}
		idx = idx[n:]
		f := psFrame(ph, off, len(grads), end >= len(grads))
		f.Data, f.Span = buf, end-off
		if err := send.SendFrame(f); err != nil {
			return err
		}
		if f.Last {
			return nil
		}
	}
}

// pushP is PowerSGD's phase 1: with error feedback the matrix to compress
// is gradient + residual (built in work; the residual is kept until
// Applied); P_i = M_i·Q with the warm-start Q (or a fresh random one,
// drawn as in ring mode), then the uncompressed tensors.
func (p *PSPusher) pushP(step int64, grads []float32, send PSSender) error {
	s := p.psgd
	if !s.cfg.NoErrorFeedback {
		for i := range s.mats {
			m := &s.mats[i]
			d := s.work[m.eOff : m.eOff+m.rows*m.cols]
			copy(d, s.err[m.eOff:m.eOff+len(d)])
			add(d, grads[m.off:m.off+len(d)])
		}
	} else {
		for i := range s.mats {
			m := &s.mats[i]
			copy(s.work[m.eOff:m.eOff+m.rows*m.cols], grads[m.off:])
		}
	}
	if !s.qInit || s.cfg.NoWarmStart {
		for i := range s.mats {
			s.randomQ(&s.mats[i], step)
		}
	}
	for i := range s.mats {
		m := &s.mats[i]
		s.mulPQ(s.pu[m.pOff:m.pOff+m.rows*m.rank], s.work[m.eOff:m.eOff+m.rows*m.cols], s.q[m.qOff:m.qOff+m.cols*m.rank], m)
	}
	u := s.pu[s.nP:]
	for _, i := range s.flat {
		sg := s.segs[i]
		copy(u, grads[sg.Offset:sg.Offset+sg.Len])
		u = u[sg.Len:]
	}
	return psPieces(1, s.pu, send.SendF32)
}

// FactorLen is the length of the factors the server sends after phase
// (1: P, 2: Q); 0 when the scheme has none.
func (p *PSPusher) FactorLen(phase uint32) int {
	if p.psgd == nil {
		return 0
	}
	switch phase {
	case 1:
		return p.psgd.nP
	case 2:
		return p.psgd.nQ
	}
	return 0
}

// PushQ is PowerSGD's phase 2 of step: given the orthogonalised P the
// server sent (FactorLen(1) values), it sends Q_i = M_iᵀ·P (float32
// frames, through send.SendF32).
func (p *PSPusher) PushQ(step int64, pm []float32, send PSSender) error {
	s := p.psgd
	if s == nil || len(pm) != s.nP {
		return fmt.Errorf("compress: PushQ: %d values of P; this job's PowerSGD has %d", len(pm), p.FactorLen(1))
	}
	start := time.Now()
	var comm time.Duration
	defer func() { p.addTime(start, comm) }()
	send = timedSender{p: p, s: send, comm: &comm}
	copy(s.pu, pm)
	for i := range s.mats {
		m := &s.mats[i]
		s.mulQ(s.qNext[m.qOff:m.qOff+m.cols*m.rank], s.work[m.eOff:m.eOff+m.rows*m.cols], s.pu[m.pOff:m.pOff+m.rows*m.rank], m)
	}
	return psPieces(2, s.qNext, send.SendF32)
}

// Applied records that the server applied step: the compression state
// moves on (top-k's residual keeps what was not sent; PowerSGD's keeps
// M − P·Qᵀ, computed as the server did, and q, the averaged Q the server
// sent (FactorLen(2) values), becomes the warm start). q is nil for every
// other scheme and step.
func (p *PSPusher) Applied(step int64, q []float32) error {
	start := time.Now()
	defer p.addTime(start, 0)
	if p.pending {
		switch {
		case p.topk != nil && p.topk.res != nil:
			t := p.topk
			for _, j := range t.idx {
				t.work[j] = 0
			}
			t.res, t.work = t.work, t.res
		case p.psgd != nil:
			s := p.psgd
			if len(q) != s.nQ {
				return fmt.Errorf("compress: %d values of Q after step %d; this job's PowerSGD has %d", len(q), step, s.nQ)
			}
			copy(s.q, q)
			s.qInit = true
			for i := range s.mats {
				m := &s.mats[i]
				n := m.rows * m.cols
				if s.err == nil {
					continue
				}
				e := s.err[m.eOff : m.eOff+n]
				psLowRank(e, s.pu[m.pOff:m.pOff+m.rows*m.rank], s.q[m.qOff:m.qOff+m.cols*m.rank], m)
				d := s.work[m.eOff : m.eOff+n]
				for i, v := range e {
					e[i] = d[i] - v
				}
			}
		}
	}
	p.pending = false
	p.mu.Lock()
	p.stats.Steps++
	p.stats.RawBytes += 4 * int64(p.plan.total)
	p.stats.SentBytes += p.sent
	p.stats.WireBytes += p.sent
	p.mu.Unlock()
	return nil
}

// state is the Stateful this pusher delegates to.
func (p *PSPusher) state() Stateful {
	switch {
	case p.topk != nil:
		return p.topk
	case p.psgd != nil:
		return p.psgd
	}
	return noState{}
}

// noState is the Stateful of a scheme without state.
type noState struct{ stateless }

func (noState) State() map[string]models.Tensor { return map[string]models.Tensor{} }

func (noState) SetState(st map[string]models.Tensor) error { return checkStateNames(st, nil) }

// State implements Stateful.
func (p *PSPusher) State() map[string]models.Tensor { return p.state().State() }

// SetState implements Stateful.
func (p *PSPusher) SetState(st map[string]models.Tensor) error { return p.state().SetState(st) }

// FlatLen implements Stateful.
func (p *PSPusher) FlatLen() (shared, own int) { return p.state().FlatLen() }

// CopyState implements Stateful.
func (p *PSPusher) CopyState(dst *Flat) { p.state().CopyState(dst) }

// RestoreState implements Stateful.
func (p *PSPusher) RestoreState(src *Flat) error { return p.state().RestoreState(src) }
