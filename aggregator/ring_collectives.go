package aggregator

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/gradsync/gradsync/internal/fsum"
)

// AllReduce sums buf element-wise over all ranks of r, in place. On success
// every rank holds bit-identical sums. All ranks must call it with the same
// len(buf), step and opt; a disagreement is reported as ErrUnexpectedFrame
// by a neighbour (or as a context error by ranks further away).
//
// The schedule is a reduce-scatter of n−1 ring steps followed by an
// all-gather of n−1 ring steps, each ring chunk pipelined as frames of at
// most opt.MaxFrameElems elements; see the package documentation.
func AllReduce(ctx context.Context, r Ring, buf []float32, step int64, opt Options) error {
	rank, n, err := check(r, opt)
	if err != nil || n == 1 || len(buf) == 0 {
		return err
	}
	limit := opt.maxFrame()
	nsend := 0
	for g := range 2*n - 2 { // global ring step g sends chunk (rank−g) mod n
		_, size := segment(len(buf), n, mod(rank-g, n))
		nsend += nframes(size, limit)
	}
	p := newPipe(ctx, r, OpAllReduce, step, opt, nsend)
	return p.wrap(p.finish(p.allReduce(buf)))
}

func (p *pipe) allReduce(buf []float32) error {
	rank, n := p.rank, p.n
	steps := 2*n - 2
	phaseOf := func(g int) uint32 {
		if g < n-1 {
			return PhaseReduceScatter
		}
		return PhaseGather
	}
	off, size := segment(len(buf), n, rank)
	for o, m := range subchunks(off, size, p.frameElems) {
		p.send(PhaseReduceScatter, uint32(rank), o, buf[o:o+m])
	}
	for g := range steps {
		// At global step g this rank receives chunk (rank−g−1) mod n: in the
		// reduce-scatter it adds its own contribution, in the all-gather it
		// takes the final value. Either way, the same chunk is what it sends
		// at step g+1, so each sub-chunk is forwarded as soon as it is done.
		c := mod(rank-g-1, n)
		phase := phaseOf(g)
		off, size := segment(len(buf), n, c)
		for o, m := range subchunks(off, size, p.frameElems) {
			dst := buf[o : o+m]
			if err := p.recvInto(phase, uint32(c), o, dst, phase == PhaseReduceScatter); err != nil {
				return err
			}
			if g+1 < steps {
				p.send(phaseOf(g+1), uint32(c), o, dst)
			}
		}
	}
	return nil
}

// AllGather concatenates every rank's src into dst in rank order:
// dst[i*len(src):(i+1)*len(src)] receives rank i's src. len(src) must be the
// same on all ranks and len(dst) must be Size()*len(src). src may alias this
// rank's block of dst.
func AllGather(ctx context.Context, r Ring, dst, src []float32, step int64, opt Options) error {
	rank, n, err := check(r, opt)
	if err != nil {
		return err
	}
	k := len(src)
	if len(dst) != n*k {
		panic(fmt.Sprintf("aggregator: AllGather: len(dst) = %d, want Size()*len(src) = %d*%d", len(dst), n, k))
	}
	copy(dst[rank*k:(rank+1)*k], src)
	if n == 1 || k == 0 {
		return nil
	}
	p := newPipe(ctx, r, OpAllGather, step, opt, (n-1)*nframes(k, opt.maxFrame()))
	return p.wrap(p.finish(p.allGather(dst, k)))
}

func (p *pipe) allGather(dst []float32, k int) error {
	rank, n := p.rank, p.n
	for o, m := range subchunks(rank*k, k, p.frameElems) {
		p.send(PhaseGather, uint32(rank), o, dst[o:o+m])
	}
	for g := range n - 1 {
		c := mod(rank-g-1, n)
		for o, m := range subchunks(c*k, k, p.frameElems) {
			if err := p.recvInto(PhaseGather, uint32(c), o, dst[o:o+m], false); err != nil {
				return err
			}
			if g+1 < n-1 {
				p.send(PhaseGather, uint32(c), o, dst[o:o+m])
			}
		}
	}
	return nil
}

// Broadcast copies root's buf into buf on every other rank. The data flows
// root → root+1 → … → root−1 along the ring, pipelined frame by frame;
// frames carry the root in Chunk. All ranks must agree on root and len(buf).
// A rank that wrongly believes it is the root only sends, so it may return
// nil; the ranks downstream of it reject its frames.
func Broadcast(ctx context.Context, r Ring, buf []float32, root int, step int64, opt Options) error {
	rank, n, err := check(r, opt)
	if err != nil {
		return err
	}
	if root < 0 || root >= n {
		return fmt.Errorf("aggregator: broadcast: root %d out of range [0, %d)", root, n)
	}
	if n == 1 || len(buf) == 0 {
		return nil
	}
	dist := mod(rank-root, n) // hops from the root
	nsend := 0
	if dist < n-1 {
		nsend = nframes(len(buf), opt.maxFrame())
	}
	p := newPipe(ctx, r, OpBroadcast, step, opt, nsend)
	return p.wrap(p.finish(p.broadcast(buf, root, dist)))
}

func (p *pipe) broadcast(buf []float32, root, dist int) error {
	for o, m := range subchunks(0, len(buf), p.frameElems) {
		if dist > 0 {
			if err := p.recvInto(PhaseGather, uint32(root), o, buf[o:o+m], false); err != nil {
				return err
			}
		}
		if dist < p.n-1 {
			p.send(PhaseGather, uint32(root), o, buf[o:o+m])
		}
	}
	return nil
}

// Barrier returns once every rank of r has entered it. An empty token makes
// n−1 hops; at hop g it carries Chunk g, and a rank forwards hop g+1 only
// after receiving hop g, so receiving hop n−2 proves that all n−1 other
// ranks have entered.
func Barrier(ctx context.Context, r Ring, step int64, opt Options) error {
	_, n, err := check(r, opt)
	if err != nil || n == 1 {
		return err
	}
	p := newPipe(ctx, r, OpBarrier, step, opt, n-1)
	return p.wrap(p.finish(p.barrier()))
}

func (p *pipe) barrier() error {
	p.send(PhaseGather, 0, 0, nil)
	for g := range p.n - 1 {
		if _, err := p.recv(PhaseGather, uint32(g), 0, 0); err != nil {
			return err
		}
		if g+1 < p.n-1 {
			p.send(PhaseGather, uint32(g+1), 0, nil)
		}
	}
	return nil
}

func check(r Ring, opt Options) (rank, n int, err error) {
	if err := opt.Validate(); err != nil {
		return 0, 0, err
	}
	rank, n = r.Rank(), r.Size()
	if n < 1 || rank < 0 || rank >= n {
		return 0, 0, fmt.Errorf("aggregator: ring reports rank %d of size %d", rank, n)
	}
	return rank, n, nil
}

// segment returns the element range [off, off+size) of ring chunk i when
// length elements are split over n ranks. As in gloo's ring algorithms the
// chunks are contiguous and in rank order, but the remainder is spread so
// that chunk sizes differ by at most one: the first length%n chunks get
// length/n+1 elements, the rest length/n (some are empty when length < n).
func segment(length, n, i int) (off, size int) {
	base, rem := length/n, length%n
	off = i*base + min(i, rem)
	size = base
	if i < rem {
		size++
	}
	return off, size
}

// subchunks yields (offset, length) of the frames that [off, off+size) is
// sent as: full frames of limit elements, then the remainder. An empty range
// yields nothing.
func subchunks(off, size, limit int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for o := off; o < off+size; o += limit {
			if !yield(o, min(limit, off+size-o)) {
				return
			}
		}
	}
}

func nframes(size, limit int) int { return (size + limit - 1) / limit }

func mod(a, n int) int { return ((a % n) + n) % n }

// pipe runs one collective call on one rank: the calling goroutine receives
// from the left and does the arithmetic; a sender goroutine owned by the
// call drains a queue of frames to the right. The queue holds every frame
// the call will send, so enqueueing never blocks, the receiver never waits
// on the right neighbour, and the ring cannot deadlock however little the
// links buffer.
type pipe struct {
	parent     context.Context
	ctx        context.Context    // parent, also cancelled on the first failure
	cancel     context.CancelFunc // cancels ctx
	ring       Ring
	rank, n    int
	frameElems int           // elements per frame, at most
	hdr        Frame         // Generation, Op and Step of every frame
	q          chan Frame    // frames to send; capacity = all frames of the call
	done       chan struct{} // closed when the sender goroutine has returned
	sendErr    error         // written by the sender before done is closed
}

func newPipe(ctx context.Context, r Ring, op OpKind, step int64, opt Options, nsend int) *pipe {
	p := &pipe{
		parent:     ctx,
		ring:       r,
		rank:       r.Rank(),
		n:          r.Size(),
		frameElems: opt.maxFrame(),
		hdr:        Frame{Generation: opt.Generation, Op: op, Step: step},
		q:          make(chan Frame, nsend),
		done:       make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(ctx)
	go p.sender()
	return p
}

func (p *pipe) sender() {
	defer close(p.done)
	for f := range p.q {
		if err := p.ring.SendRight(p.ctx, f); err != nil {
			p.sendErr = err
			p.cancel() // unblock the receiver
			return
		}
	}
}

// send queues a frame. data aliases the caller's buffer; the schedule never
// writes a range again before the frame that carries it has been passed to
// SendRight (a later write to it causally follows the right neighbour
// having received it), and SendRight does not retain data.
func (p *pipe) send(phase, chunk uint32, off int, data []float32) {
	f := p.hdr
	f.Phase, f.Chunk, f.Offset, f.Data = phase, chunk, off, data
	select {
	case p.q <- f:
	default:
		panic("aggregator: internal error: send queue sized too small")
	}
}

// recv receives the next frame and checks that it is exactly the one
// expected; only then is its data returned.
func (p *pipe) recv(phase, chunk uint32, off, size int) ([]float32, error) {
	f, err := p.ring.RecvLeft(p.ctx)
	if err != nil {
		return nil, err
	}
	if err := p.check(f, len(f.Data), phase, chunk, off, size); err != nil {
		return nil, err
	}
	return f.Data, nil
}

// recvInto receives the next frame, checks that it is exactly the one
// expected (len(dst) values at offset off), and only then adds its data
// to dst (add) or copies it there.
func (p *pipe) recvInto(phase, chunk uint32, off int, dst []float32, add bool) error {
	if rr, ok := p.ring.(ReducingRing); ok {
		return rr.RecvLeftInto(p.ctx, dst, add, func(f Frame, n int) error {
			return p.check(f, n, phase, chunk, off, len(dst))
		})
	}
	data, err := p.recv(phase, chunk, off, len(dst))
	if err != nil {
		return err
	}
	if add {
		fsum.Add(dst, data)
	} else {
		copy(dst, data)
	}
	return nil
}

// check reports an ErrUnexpectedFrame unless f, carrying n values, has
// the tags of the frame expected next.
func (p *pipe) check(f Frame, n int, phase, chunk uint32, off, size int) error {
	want := p.hdr
	want.Phase, want.Chunk, want.Offset = phase, chunk, off
	if f.Generation != want.Generation || f.Op != want.Op || f.Step != want.Step ||
		f.Phase != want.Phase || f.Chunk != want.Chunk || f.Offset != want.Offset || n != size {
		return fmt.Errorf("%w from rank %d: got %s, want %s",
			ErrUnexpectedFrame, mod(p.rank-1, p.n), tags(f, n), tags(want, size))
	}
	return nil
}

func tags(f Frame, size int) string {
	return fmt.Sprintf("{gen %d %v step %d phase %d chunk %d offset %d len %d}",
		f.Generation, f.Op, f.Step, f.Phase, f.Chunk, f.Offset, size)
}

// finish ends the call: it stops the sender (after it has sent everything,
// unless err != nil), waits for it, and returns the error that explains the
// failure best.
func (p *pipe) finish(err error) error {
	close(p.q)
	if err != nil {
		p.cancel()
	}
	<-p.done
	p.cancel()
	if p.sendErr != nil && (err == nil || p.parent.Err() == nil && errors.Is(err, context.Canceled)) {
		// The receiver stopped because the sender failed and cancelled it.
		err = p.sendErr
	}
	return err
}

func (p *pipe) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("aggregator: %v rank %d/%d step %d: %w", p.hdr.Op, p.rank, p.n, p.hdr.Step, err)
}
