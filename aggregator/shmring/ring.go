package shmring

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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

// Offer is what a rank tells its right neighbour over the control plane
// (the authenticated Collective stream) so that it can attach the
// segment of their link. It carries no secret.
type Offer struct {
	Name  string   // the segment's file name in Config.Dir
	Rank  int      // the creator's rank
	PID   int      // the creator's process
	Nonce [16]byte // random, also in the segment header
}

// nameLen is the length of a segment's file name: "gradsync-" and 24 hex
// digits.
const namePrefix, nameHex = "gradsync-", 24

func (o Offer) validate(left int) error {
	if len(o.Name) != len(namePrefix)+nameHex || o.Name[:len(namePrefix)] != namePrefix {
		return fmt.Errorf("shmring: offer names segment %q; want %s followed by %d hex digits", o.Name, namePrefix, nameHex)
	}
	if _, err := hex.DecodeString(o.Name[len(namePrefix):]); err != nil {
		return fmt.Errorf("shmring: offer names segment %q; want %s followed by %d hex digits", o.Name, namePrefix, nameHex)
	}
	if o.Rank != left {
		return fmt.Errorf("shmring: offer from rank %d; the left neighbour is rank %d", o.Rank, left)
	}
	if o.PID <= 0 {
		return fmt.Errorf("shmring: offer names process %d", o.PID)
	}
	return nil
}

// Pending is a rank whose outbound segment exists but whose ring is not
// connected yet. Connect it, or Close it to give up.
type Pending struct {
	cfg  Config
	out  *link     // nil in a ring of one
	once sync.Once // Connect or Close, whichever comes first
}

// Create makes this rank's outbound segment (the link to rank Rank+1) in
// cfg's directory, with O_EXCL and mode 0600, and returns the offer to
// send to the right neighbour. Nothing is shared before Connect.
func Create(cfg Config) (*Pending, Offer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, Offer{}, err
	}
	p := &Pending{cfg: cfg}
	if cfg.Size == 1 {
		return p, Offer{}, nil
	}
	if removed, err := Sweep(cfg.dir()); len(removed) > 0 || err != nil {
		cfg.log().Info("shmring: removed segments left by crashed processes", "dir", cfg.dir(), "removed", removed, "err", err)
	}
	var id [nameHex / 2]byte
	offer := Offer{Rank: cfg.Rank, PID: os.Getpid()}
	rand.Read(id[:])
	rand.Read(offer.Nonce[:])
	offer.Name = namePrefix + hex.EncodeToString(id[:])
	path := filepath.Join(cfg.dir(), offer.Name)
	h := segHeader{
		Slots: cfg.Slots, SlotSize: cfg.slotSize(), Generation: cfg.Generation,
		From: cfg.Rank, To: (cfg.Rank + 1) % cfg.Size, Size: cfg.Size,
		PID: offer.PID, Nonce: offer.Nonce, Job: jobHash(cfg.JobID),
	}
	if h.Slots == 0 {
		h.Slots = DefaultSlots
	}
	h.Total = segmentSize(h.Slots, h.SlotSize)
	h.MAC = h.mac(cfg.Secret)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, Offer{}, fmt.Errorf("shmring: creating the segment of link %d → %d: %w", h.From, h.To, err)
	}
	mem, err := func() ([]byte, error) {
		defer f.Close() // the mapping keeps the segment
		// 0600 whatever the umask, which could have narrowed it (the
		// attacher checks the mode).
		if err := f.Chmod(0o600); err != nil {
			return nil, err
		}
		if err := f.Truncate(int64(h.Total)); err != nil {
			return nil, err
		}
		return mapFile(f, h.Total)
	}()
	if err != nil {
		_ = os.Remove(path)
		return nil, Offer{}, fmt.Errorf("shmring: creating the segment of link %d → %d: %w", h.From, h.To, err)
	}
	h.encode(mem)
	p.out = newLink(mem, h, path, h.To)
	return p, offer, nil
}

// Close gives up a Pending that was not connected: its segment is
// unmapped and removed. Close after Connect does nothing; during Connect
// it waits for Connect to return (cancel Connect's context to stop it).
func (p *Pending) Close() error {
	p.once.Do(func() {
		if p.out != nil {
			p.out.release()
		}
	})
	return nil
}

// Connect attaches the left neighbour's segment named by left (its
// Create's offer), waits (under ctx) until the right neighbour has
// attached this rank's segment with the job's secret, and returns the
// connected ring. Both segments are unlinked from the directory as soon
// as both sides have mapped them. Whatever fails, nothing is left behind
// and the error says why (a refusal wraps ErrRefused).
func (p *Pending) Connect(ctx context.Context, left Offer) (*Ring, error) {
	var r *Ring
	var err error
	ran := false
	p.once.Do(func() {
		ran = true
		r, err = p.connect(ctx, left)
		if err != nil && p.out != nil {
			// A right neighbour waiting for this rank's acceptance gives
			// up at once.
			p.out.prodClosed.Store(1)
			futexWake(p.out.attach)
			p.out.release()
		}
	})
	if !ran {
		return nil, errors.New("shmring: Connect called on a closed or already connected Pending")
	}
	return r, err
}

func (p *Pending) connect(ctx context.Context, offer Offer) (*Ring, error) {
	cfg := p.cfg
	n := cfg.Size
	r := &Ring{rank: cfg.Rank, n: n, left: (cfg.Rank + n - 1) % n, right: (cfg.Rank + 1) % n, out: p.out}
	if n == 1 {
		return r, nil
	}
	in, err := attach(cfg, offer)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Ring, error) {
		in.release()
		return nil, err
	}
	if err := p.accept(ctx); err != nil {
		in.consClosed.Store(1) // the left neighbour's Connect fails at once
		futexWake(in.attach)
		return fail(err)
	}
	if err := await(ctx, in.attach, func() bool {
		return in.attach.Load() != attachDone || in.prodClosed.Load() != 0 || in.peer.exited()
	}); err != nil {
		return fail(fmt.Errorf("shmring: rank %d: waiting for the left neighbour rank %d to accept: %w", cfg.Rank, r.left, err))
	}
	if in.attach.Load() != attachAccepted && in.peer.exited() {
		return fail(&aggregator.PeerError{Rank: r.left, Err: fmt.Errorf("%w: its process exited while linking", aggregator.ErrPeerGone)})
	}
	if s := in.attach.Load(); s != attachAccepted {
		return fail(fmt.Errorf("%w: rank %d: the left neighbour rank %d did not accept this rank's attach (state %d)", ErrRefused, cfg.Rank, r.left, s))
	}
	r.in = in
	r.linkedAt = time.Now().UnixNano()
	cfg.log().Debug("shmring: ring linked", "job", cfg.JobID, "generation", cfg.Generation, "rank", cfg.Rank, "size", n,
		"left", r.left, "right", r.right, "slots", p.out.hdr.Slots, "max_frame_elems", p.out.maxElems)
	return r, nil
}

// attach maps and checks the left neighbour's segment, unlinks it, and
// writes this rank's proof of the secret into it.
func attach(cfg Config, offer Offer) (*link, error) {
	left := (cfg.Rank + cfg.Size - 1) % cfg.Size
	if err := offer.validate(left); err != nil {
		return nil, err
	}
	path := filepath.Join(cfg.dir(), offer.Name)
	f, err := os.OpenFile(path, os.O_RDWR|nofollow, 0)
	if err != nil {
		return nil, fmt.Errorf("shmring: rank %d: opening the segment of link %d → %d: %w", cfg.Rank, left, cfg.Rank, err)
	}
	mem, err := func() ([]byte, error) {
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			return nil, fmt.Errorf("%w: segment %s has mode %v; want a regular file with mode 0600", ErrRefused, path, fi.Mode())
		}
		if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
			return nil, fmt.Errorf("%w: segment %s belongs to uid %d, not to this process's %d", ErrRefused, path, uid, os.Geteuid())
		}
		if fi.Size() < dataOff || fi.Size() > int64(segmentSize(maxSlots, maxSlotSize)) {
			return nil, fmt.Errorf("%w: segment %s is %d bytes long", ErrCorrupt, path, fi.Size())
		}
		return mapFile(f, int(fi.Size()))
	}()
	if err != nil {
		return nil, fmt.Errorf("shmring: rank %d: segment of link %d → %d: %w", cfg.Rank, left, cfg.Rank, err)
	}
	// Both sides have it mapped now: the name is no longer needed, and
	// without it nothing outlives the two processes.
	_ = os.Remove(path)
	h, err := decodeSegment(mem, len(mem))
	if err == nil {
		err = checkSegment(cfg, offer, h)
	}
	if err != nil {
		// Tell the creator, which waits for an attach, that none comes.
		if len(mem) >= dataOff {
			word(mem, offProdClosed+4).Store(1)
			futexWake(word(mem, offAttach))
		}
		_ = unmap(mem)
		cfg.log().Warn("shmring: segment refused", "job", cfg.JobID, "rank", cfg.Rank, "from", left, "err", err)
		return nil, fmt.Errorf("shmring: rank %d: segment of link %d → %d: %w", cfg.Rank, left, cfg.Rank, err)
	}
	l := newLink(mem, h, "", left)
	if l.peer, err = watchProcess(h.PID); err != nil {
		l.release()
		return nil, err
	}
	pid := os.Getpid()
	tok := token(cfg.Secret, h.Nonce, cfg.Rank, pid)
	copy(mem[offToken:offToken+32], tok[:])
	word(mem, offAttacherPID).Store(uint32(pid))
	word(mem, offAttacherRank).Store(uint32(cfg.Rank))
	l.attach.Store(attachDone)
	futexWake(l.attach)
	return l, nil
}

// checkSegment checks that a well-formed header is the one offered for
// this job's link: authenticated with the secret, and naming this job,
// generation, link and creator.
func checkSegment(cfg Config, offer Offer, h segHeader) error {
	if want := h.mac(cfg.Secret); !hmac.Equal(want[:], h.MAC[:]) {
		return fmt.Errorf("%w: the segment header does not authenticate with this job's secret (made by another job, or damaged)", ErrRefused)
	}
	switch {
	case h.Job != jobHash(cfg.JobID):
		return fmt.Errorf("%w: the segment belongs to another job", ErrRefused)
	case h.Generation != cfg.Generation:
		return fmt.Errorf("%w: the segment is of generation %d, this ring's is %d", ErrRefused, h.Generation, cfg.Generation)
	case h.Size != cfg.Size || h.To != cfg.Rank:
		return fmt.Errorf("%w: the segment is link %d → %d of a ring of %d, not the link to rank %d of %d", ErrRefused, h.From, h.To, h.Size, cfg.Rank, cfg.Size)
	case h.Nonce != offer.Nonce || h.PID != offer.PID:
		return fmt.Errorf("%w: the segment is not the one offered", ErrRefused)
	}
	return nil
}

// accept waits until the right neighbour has attached this rank's
// segment, checks its proof of the secret, and tells it the outcome.
func (p *Pending) accept(ctx context.Context) error {
	out, cfg := p.out, p.cfg
	if err := await(ctx, out.attach, func() bool { return out.attach.Load() != attachNone || out.consClosed.Load() != 0 }); err != nil {
		return fmt.Errorf("shmring: rank %d: waiting for the right neighbour rank %d to attach: %w", cfg.Rank, out.peerRank, err)
	}
	if out.consClosed.Load() != 0 {
		return fmt.Errorf("shmring: rank %d: the right neighbour rank %d refused or gave up this rank's segment", cfg.Rank, out.peerRank)
	}
	_ = os.Remove(out.path) // normally the attacher did already
	var got [32]byte
	copy(got[:], out.mem[offToken:offToken+32])
	pid := int(word(out.mem, offAttacherPID).Load())
	rank := int(word(out.mem, offAttacherRank).Load())
	want := token(cfg.Secret, out.hdr.Nonce, rank, pid)
	var err error
	switch {
	case out.attach.Load() != attachDone:
		err = fmt.Errorf("%w: attach state %d", ErrCorrupt, out.attach.Load())
	case !hmac.Equal(got[:], want[:]):
		err = fmt.Errorf("%w: the process that attached (pid %d) does not hold this job's secret", ErrRefused, pid)
	case rank != out.peerRank:
		err = fmt.Errorf("%w: rank %d attached; the right neighbour is rank %d", ErrRefused, rank, out.peerRank)
	}
	if err == nil {
		out.peer, err = watchProcess(pid)
	}
	if err != nil {
		out.attach.Store(attachRefused)
		futexWake(out.attach)
		cfg.log().Warn("shmring: attach refused", "job", cfg.JobID, "rank", cfg.Rank, "to", out.peerRank, "err", err)
		return fmt.Errorf("shmring: rank %d: link %d → %d: %w", cfg.Rank, cfg.Rank, out.peerRank, err)
	}
	out.attach.Store(attachAccepted)
	futexWake(out.attach)
	return nil
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

	head, tail              *atomic.Uint64
	dataSeq, dataSleeping   *atomic.Uint32
	spaceSeq, spaceSleeping *atomic.Uint32
	prodClosed, consClosed  *atomic.Uint32
	attach                  *atomic.Uint32
	next                    uint64 // the next frame to publish (producer) or take (consumer); only the owning call touches it
	maxElems                int
	releaseOnce             sync.Once
}

func newLink(mem []byte, h segHeader, path string, peerRank int) *link {
	return &link{
		mem: mem, hdr: h, path: path, peerRank: peerRank,
		head: word64(mem, offHead), tail: word64(mem, offTail),
		dataSeq: word(mem, offDataSeq), dataSleeping: word(mem, offDataSeq+4),
		spaceSeq: word(mem, offSpaceSeq), spaceSleeping: word(mem, offSpaceSeq+4),
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
	for _, w := range []*atomic.Uint32{l.dataSeq, l.spaceSeq} {
		w.Add(1)
		futexWake(w)
	}
}

// release unmaps the segment and removes its name if it still has one.
func (l *link) release() {
	l.releaseOnce.Do(func() {
		if l.path != "" {
			_ = os.Remove(l.path) // usually gone already: the attacher removes it
		}
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

// wait blocks until ready() or the ring breaks: a short spin, then futex
// sleeps on seq, announced in sleeping so that the other side wakes it.
func (r *Ring) wait(ctx context.Context, seq, sleeping *atomic.Uint32, l, other *link, ready func() (bool, error)) error {
	for range spins {
		if ok, err := ready(); ok || err != nil {
			return err
		}
	}
	defer sleeping.Store(0)
	for {
		sleeping.Store(1)
		v := seq.Load()
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
		futexWait(seq, v, pollInterval)
	}
}

// wake wakes the other side of seq if it said it sleeps. The order (the
// counter was stored before, sleeping is loaded after; the sleeper stores
// sleeping before it loads seq and re-checks the counter) means one of
// the two always sees the other.
func wake(seq, sleeping *atomic.Uint32) {
	if sleeping.Load() != 0 {
		seq.Add(1)
		futexWake(seq)
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
	err := r.wait(ctx, out.spaceSeq, out.spaceSleeping, out, r.in, func() (bool, error) {
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
	wake(out.dataSeq, out.dataSleeping)
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
		err = r.wait(ctx, in.dataSeq, in.dataSleeping, in, r.out, ready)
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
	wake(in.spaceSeq, in.spaceSleeping)
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
