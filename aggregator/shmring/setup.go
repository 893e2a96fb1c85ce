package shmring

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gradsync/gradsync/aggregator"
)

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
	dataBell, spaceBell := bellPaths(path)
	if p.out.dataBell, err = makeBell(dataBell); err == nil {
		p.out.spaceBell, err = makeBell(spaceBell)
	}
	if err != nil {
		p.out.release()
		return nil, Offer{}, fmt.Errorf("shmring: creating the wake-ups of link %d → %d: %w", h.From, h.To, err)
	}
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
	// The bells next: then both sides have everything open, the names
	// are no longer needed, and without them nothing outlives the two
	// processes.
	dataPath, spacePath := bellPaths(path)
	dataBell, berr := openBell(dataPath)
	var spaceBell *bell
	if berr == nil {
		spaceBell, berr = openBell(spacePath)
	}
	for _, name := range []string{path, dataPath, spacePath} {
		_ = os.Remove(name)
	}
	h, err := decodeSegment(mem, len(mem))
	if err == nil {
		err = checkSegment(cfg, offer, h)
	}
	if err == nil && berr != nil {
		err = fmt.Errorf("%w: its wake-ups: %w", ErrRefused, berr)
	}
	if err != nil {
		dataBell.close()
		spaceBell.close()
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
	l.dataBell, l.spaceBell = dataBell, spaceBell
	dataBell.path, spaceBell.path = "", ""
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
	out.unlink() // normally the attacher did already
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
