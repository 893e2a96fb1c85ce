package shmring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/fsum"
)

// Defaults and limits of Config.
const (
	// DefaultDir is where segments are created unless Config.Dir says
	// otherwise: the tmpfs that glibc's shm_open uses.
	DefaultDir = "/dev/shm"
	// DefaultSlots frames may wait on a link.
	DefaultSlots = 4
	// MinSecretLen is the shortest job secret accepted.
	MinSecretLen = 16

	maxRanks = 1 << 16
	// spins is how many times a waiter re-reads a counter before it
	// sleeps: about a microsecond, long enough to catch a neighbour that
	// is just finishing a frame without a system call.
	spins = 200
	// pollInterval bounds one futex sleep. A sleeper wakes at least this
	// often to notice its context ending and a neighbour process dying;
	// everything else (new frames, free slots, Close) wakes it at once.
	pollInterval = 20 * time.Millisecond
)

// Config says which ring link this rank sets up. The zero values of the
// optional fields give the documented defaults.
type Config struct {
	// Dir holds the segments while they are being set up; "" means
	// DefaultDir. Both neighbours must see the same directory.
	Dir string
	// JobID and Generation name the ring; every rank must agree.
	JobID      string
	Generation uint64
	// Rank is this rank in [0, Size).
	Rank, Size int
	// Secret is the job's secret (at least MinSecretLen bytes), known
	// only to the job's ranks: a segment is used only if its header was
	// authenticated with it, and an attacher only if it proves it has it.
	Secret []byte
	// MaxFrameElems bounds the float32 values of one frame; 0 means
	// aggregator.MaxFrameElemsLimit, so any frame the collectives send
	// fits. Untouched slot memory costs nothing (tmpfs pages are
	// allocated on first write).
	MaxFrameElems int
	// Slots is how many frames may wait on the link; 0 means
	// DefaultSlots. A full link blocks SendRight (backpressure).
	Slots int
	// Log receives refusals (a wrong secret, a foreign segment); nil
	// discards them.
	Log *slog.Logger
}

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.JobID == "":
		return errors.New("shmring: Config.JobID is required")
	case c.Size < 1 || c.Size > maxRanks:
		return fmt.Errorf("shmring: Config.Size %d out of range [1, %d]", c.Size, maxRanks)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("shmring: Config.Rank %d out of range [0, %d)", c.Rank, c.Size)
	case len(c.Secret) < MinSecretLen:
		return fmt.Errorf("shmring: Config.Secret is %d bytes long; at least %d required", len(c.Secret), MinSecretLen)
	case c.MaxFrameElems < 0 || c.MaxFrameElems > aggregator.MaxFrameElemsLimit:
		return fmt.Errorf("shmring: Config.MaxFrameElems %d out of range: want 0 (default %d) to %d",
			c.MaxFrameElems, aggregator.MaxFrameElemsLimit, aggregator.MaxFrameElemsLimit)
	case c.Slots < 0 || c.Slots > maxSlots:
		return fmt.Errorf("shmring: Config.Slots %d out of range: want 0 (default %d) to %d", c.Slots, DefaultSlots, maxSlots)
	}
	return nil
}

func (c Config) dir() string {
	if c.Dir == "" {
		return DefaultDir
	}
	return c.Dir
}

func (c Config) slotSize() int {
	e := c.MaxFrameElems
	if e == 0 {
		e = aggregator.MaxFrameElemsLimit
	}
	return (frameHdrLen + 4*e + line - 1) / line * line
}

func (c Config) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// await waits until ready() holds or ctx ends, sleeping on the futex w
// between checks; whoever makes ready() true wakes w.
func await(ctx context.Context, w *atomic.Uint32, ready func() bool) error {
	for {
		v := w.Load()
		if ready() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		futexWait(w, v, pollInterval)
	}
}

// word is the u32 at off in mem, for atomic access.
func word(mem []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }

func word64(mem []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }

// link is one mapped segment: a directed link between this rank and
// peerRank, produced into (outbound) or consumed from (inbound).
type link struct {
	mem      []byte
	hdr      segHeader
	path     string // the segment's file while it may still exist ("" for an attacher)
	peerRank int
	peer     *process // the neighbour's process; nil when it is this one

	head, tail             *atomic.Uint64
	dataSleeping           *atomic.Uint32 // the receiver is asleep on dataBell
	spaceSleeping          *atomic.Uint32 // the sender is asleep on spaceBell
	dataBell, spaceBell    *bell          // nil until set up (and in tests of the protocol alone)
	prodClosed, consClosed *atomic.Uint32
	attach                 *atomic.Uint32
	next                   uint64 // the next frame to publish (producer) or take (consumer); only the owning call touches it
	maxElems               int
	releaseOnce            sync.Once
}

func newLink(mem []byte, h segHeader, path string, peerRank int) *link {
	return &link{
		mem: mem, hdr: h, path: path, peerRank: peerRank,
		head: word64(mem, offHead), tail: word64(mem, offTail),
		dataSleeping: word(mem, offDataSeq+4), spaceSleeping: word(mem, offSpaceSeq+4),
		prodClosed: word(mem, offProdClosed), consClosed: word(mem, offProdClosed+4),
		attach:   word(mem, offAttach),
		maxElems: (h.SlotSize - frameHdrLen) / 4,
	}
}

// slot is the seq-th frame's slot: its header and its payload area.
func (l *link) slot(seq uint64) (hdr []byte, payload []byte) {
	off := dataOff + int(seq%uint64(l.hdr.Slots))*l.hdr.SlotSize
	return l.mem[off : off+frameHdrLen], l.mem[off+frameHdrLen : off+l.hdr.SlotSize]
}

// wakeAll wakes every sleeper on the link (after a Close).
func (l *link) wakeAll() {
	l.dataBell.ring()
	l.spaceBell.ring()
}

// unlink removes the names of the link's segment and bells (usually gone
// already: the attacher removes them as soon as it has them open).
func (l *link) unlink() {
	if l.path != "" {
		_ = os.Remove(l.path)
	}
	l.dataBell.unlink()
	l.spaceBell.unlink()
}

// release unmaps the segment, closes the bells and removes their names
// if they still have them.
func (l *link) release() {
	l.releaseOnce.Do(func() {
		l.unlink()
		l.dataBell.close()
		l.spaceBell.close()
		l.peer.close()
		_ = unmap(l.mem)
	})
}

// Ring is this process's rank of a ring over shared memory: an
// aggregator.ReducingRing. SendRight and RecvLeft follow the
// aggregator.Ring contract; Close may be called from any goroutine.
type Ring struct {
	rank, n     int
	left, right int
	out, in     *link // nil in a ring of one

	closing atomic.Bool // set first by Close, read by waiting calls

	mu     sync.Mutex // protects closed and the Add side of active
	closed bool
	// active counts SendRight and RecvLeft calls in progress: Close waits
	// for them before it unmaps the memory they are using.
	active    sync.WaitGroup
	closeOnce sync.Once

	buf []float32 // RecvLeft's copy of the last frame; only RecvLeft touches it

	// Statistics, with the meanings of ringrpc.Ring's (the worker's
	// straggler attribution reads them).
	sentBytes, recvBytes atomic.Int64
	framesOut            atomic.Int64
	linkedAt             int64 // Unix nanoseconds when Connect returned
	// Only RecvLeft(Into) writes curOp and curStep: the collective of the
	// last frame taken, so that the first frame of the next is known.
	curOp       aggregator.OpKind
	curStep     int64
	waitNanos   atomic.Int64
	collectives atomic.Int64
}

// WaitStats reports over how many collectives this rank has received
// frames, and how long in all it blocked for the left neighbour's first
// frame of each, as ringrpc.Ring.WaitStats does.
func (r *Ring) WaitStats() (collectives int64, waited time.Duration) {
	return r.collectives.Load(), time.Duration(r.waitNanos.Load())
}

// FrameCounts reports the frames handed to SendRight and the frames the
// left neighbour has published on the link to this rank (taken or not).
func (r *Ring) FrameCounts() (sent, arrived int64) {
	if r.in == nil {
		return r.framesOut.Load(), 0
	}
	return r.framesOut.Load(), int64(r.in.head.Load())
}

// LeftIdle is how long ago the left neighbour last published a frame (or
// the ring was linked, if it has not).
func (r *Ring) LeftIdle() time.Duration {
	last := r.linkedAt
	if r.in != nil {
		last = max(last, int64(word64(r.in.mem, offPublished).Load()))
	}
	return time.Since(time.Unix(0, last))
}

// Traffic reports the tensor bytes this rank has sent to its right
// neighbour and received from its left one, and names them.
func (r *Ring) Traffic() (sent, received int64, right, left string) {
	return r.sentBytes.Load(), r.recvBytes.Load(), fmt.Sprintf("shm:rank%d", r.right), fmt.Sprintf("shm:rank%d", r.left)
}

// Shutdown closes the ring as Close does. Unlike gRPC's streams, nothing
// needs flushing: frames published stay readable in the segment, which
// lives as long as the receiver maps it, even after this process exits.
func (r *Ring) Shutdown(context.Context) error { return r.Close() }

// Rank implements aggregator.Ring.
func (r *Ring) Rank() int { return r.rank }

// Size implements aggregator.Ring.
func (r *Ring) Size() int { return r.n }

// MaxFrameElems is the most float32 values one frame may carry.
func (r *Ring) MaxFrameElems() int {
	if r.out == nil {
		return 0
	}
	return r.out.maxElems
}

func (r *Ring) enter() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return aggregator.ErrClosed
	}
	if r.n == 1 {
		return errors.New("shmring: a ring of one rank has no neighbour")
	}
	r.active.Add(1)
	return nil
}

func (r *Ring) gone(l *link, why string) error {
	return &aggregator.PeerError{Rank: l.peerRank, Err: fmt.Errorf("%w (%s)", aggregator.ErrPeerGone, why)}
}

// broken reports, in that order, ctx ending, this ring closing, the
// neighbour of link l closing its end, and (if dying: a system call each,
// so only a waiter about to sleep asks) the process of l's neighbour or
// of other's exiting. The other link's Close does not count: a neighbour
// that is done with the ring closes it while this rank may still be
// sending its last frames the other way, but a neighbour process that
// died has broken the ring whichever way this rank is waiting, and saying
// so at once (rather than at the deadline) names it on both sides.
func (r *Ring) broken(ctx context.Context, l, other *link, dying bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closing.Load() {
		return aggregator.ErrClosed
	}
	theirs := l.prodClosed
	if l == r.out {
		theirs = l.consClosed
	}
	if theirs.Load() != 0 {
		return r.gone(l, "it closed its end of the ring")
	}
	if dying {
		for _, k := range []*link{l, other} {
			if k.peer.exited() {
				return r.gone(k, "its process exited")
			}
		}
	}
	return nil
}

// wait blocks until ready() or the ring breaks: a short spin, then sleeps
// on the bell b, announced in sleeping so that the other side rings it.
func (r *Ring) wait(ctx context.Context, sleeping *atomic.Uint32, b *bell, l, other *link, ready func() (bool, error)) error {
	for range spins {
		if ok, err := ready(); ok || err != nil {
			return err
		}
	}
	defer sleeping.Store(0)
	for {
		sleeping.Store(1)
		if ok, err := ready(); ok || err != nil {
			return err
		}
		if err := r.broken(ctx, l, other, true); err != nil {
			// A neighbour publishes its last frames before it closes, and
			// may have done both since ready() looked: look again.
			if ok, rerr := ready(); ok || rerr != nil {
				return rerr
			}
			return err
		}
		b.wait(pollInterval)
	}
}

// wake rings b if the other side said it sleeps on it. The order (the
// counter was stored before, sleeping is loaded after; the sleeper stores
// sleeping before it re-checks the counter) means one of the two always
// sees the other, and a ring is never lost: the byte waits in the pipe.
func wake(sleeping *atomic.Uint32, b *bell) {
	if sleeping.Load() != 0 {
		b.ring()
	}
}

// SendRight implements aggregator.Ring: it copies f.Data into the next
// free slot of the link to the right neighbour, waiting while every slot
// is full.
func (r *Ring) SendRight(ctx context.Context, f aggregator.Frame) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.active.Done()
	out := r.out
	if len(f.Data) > out.maxElems {
		return fmt.Errorf("shmring: frame of %d float32 values; this ring's slots hold at most %d", len(f.Data), out.maxElems)
	}
	if err := r.broken(ctx, out, r.in, false); err != nil {
		return err
	}
	h := out.next
	slots := uint64(out.hdr.Slots)
	err := r.wait(ctx, out.spaceSleeping, out.spaceBell, out, r.in, func() (bool, error) {
		t := out.tail.Load()
		if t > h {
			return false, &aggregator.PeerError{Rank: out.peerRank, Err: fmt.Errorf("%w: link %d → %d: the receiver consumed frame %d, only %d were sent", ErrCorrupt, r.rank, r.right, t, h)}
		}
		return h-t < slots, nil
	})
	if err != nil {
		return err
	}
	out.raceObserve() // the receiver is done with the slot
	hdr, payload := out.slot(h)
	copy(unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), len(f.Data)), f.Data)
	encodeFrame(hdr, f, len(f.Data), h)
	out.next = h + 1
	out.head.Store(h + 1)
	out.racePublish()
	word64(out.mem, offPublished).Store(uint64(time.Now().UnixNano()))
	r.framesOut.Add(1)
	r.sentBytes.Add(int64(4 * len(f.Data)))
	wake(out.dataSleeping, out.dataBell)
	return nil
}

// next waits for the next frame from the left neighbour and returns its
// tags, its values (a view into the shared segment, valid until release)
// and its sequence number.
func (r *Ring) next(ctx context.Context) (aggregator.Frame, []float32, error) {
	in := r.in
	t := in.next
	slots := uint64(in.hdr.Slots)
	ready := func() (bool, error) {
		h := in.head.Load()
		if h < t || h-t > slots {
			return false, &aggregator.PeerError{Rank: in.peerRank, Err: fmt.Errorf("%w: link %d → %d: %d frames published, %d taken, %d slots", ErrCorrupt, r.left, r.rank, h, t, slots)}
		}
		return h > t, nil
	}
	var waited time.Duration
	ok, err := ready()
	if !ok && err == nil {
		start := time.Now() // a clock reading only when blocking
		err = r.wait(ctx, in.dataSleeping, in.dataBell, in, r.out, ready)
		waited = time.Since(start)
	}
	if err != nil {
		return aggregator.Frame{}, nil, err
	}
	in.raceObserve() // the sender has filled the slot
	hdr, payload := in.slot(t)
	f, n, err := decodeFrame(hdr, t, in.maxElems)
	if err != nil {
		return aggregator.Frame{}, nil, &aggregator.PeerError{Rank: in.peerRank, Err: fmt.Errorf("link %d → %d: %w", r.left, r.rank, err)}
	}
	var vals []float32
	if n > 0 {
		vals = unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), n)
	}
	r.recvBytes.Add(int64(4 * n))
	if f.Op != r.curOp || f.Step != r.curStep { // the first frame of a collective
		r.curOp, r.curStep = f.Op, f.Step
		r.collectives.Add(1)
		r.waitNanos.Add(int64(waited))
	}
	return f, vals, nil
}

// release hands the slot of the frame next returned back to the sender.
func (r *Ring) release() {
	in := r.in
	in.next++
	in.tail.Store(in.next)
	in.racePublish()
	wake(in.spaceSleeping, in.spaceBell)
}

// RecvLeft implements aggregator.Ring. The values are copied out of the
// shared segment (into a buffer reused by the next call), so the frame
// stays valid even if the ring is closed meanwhile. Frames the left
// neighbour published before it closed are still delivered.
func (r *Ring) RecvLeft(ctx context.Context) (aggregator.Frame, error) {
	if err := r.enter(); err != nil {
		return aggregator.Frame{}, err
	}
	defer r.active.Done()
	f, vals, err := r.next(ctx)
	if err != nil {
		return aggregator.Frame{}, err
	}
	if len(vals) > 0 {
		if cap(r.buf) < len(vals) {
			r.buf = make([]float32, len(vals))
		}
		f.Data = r.buf[:len(vals)]
		copy(f.Data, vals)
	}
	r.release()
	return f, nil
}

// RecvLeftInto implements aggregator.ReducingRing: the values are added
// or copied into dst straight from the shared segment, with no copy in
// between.
func (r *Ring) RecvLeftInto(ctx context.Context, dst []float32, add bool, accept func(aggregator.Frame, int) error) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.active.Done()
	f, vals, err := r.next(ctx)
	if err != nil {
		return err
	}
	defer r.release()
	if err := accept(f, len(vals)); err != nil {
		return err
	}
	if len(dst) != len(vals) {
		return fmt.Errorf("shmring: RecvLeftInto: accept let %d values into %d places", len(vals), len(dst))
	}
	if add {
		fsum.Add(dst, vals)
	} else {
		copy(dst, vals)
	}
	return nil
}

// Close breaks this rank at once, as if its process died: calls in
// progress return aggregator.ErrClosed, and the neighbours' calls fail
// with a *aggregator.PeerError naming this rank. Close waits for this
// ring's calls in progress to return, then unmaps its segments. It is
// idempotent and returns nil.
func (r *Ring) Close() error {
	r.closeOnce.Do(func() {
		r.closing.Store(true)
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		for _, l := range []*link{r.out, r.in} {
			if l == nil {
				continue
			}
			if l == r.out {
				l.prodClosed.Store(1)
			} else {
				l.consClosed.Store(1)
			}
			l.wakeAll()
		}
		r.active.Wait()
		for _, l := range []*link{r.out, r.in} {
			if l != nil {
				l.release()
			}
		}
	})
	return nil
}

var _ aggregator.ReducingRing = (*Ring)(nil)
