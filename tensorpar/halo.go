package tensorpar

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gradsync/gradsync/aggregator"
)

// Side names a neighbour of a spatial rank: Above is rank−1, whose strip
// holds the rows above this rank's, Below is rank+1.
type Side uint8

// Sides. The zero value is invalid so that an unset field is caught.
const (
	Above Side = iota + 1
	Below
)

func (s Side) String() string {
	switch s {
	case Above:
		return "above"
	case Below:
		return "below"
	}
	return fmt.Sprintf("side(%d)", uint8(s))
}

// Halo is point-to-point exchange between a spatial rank and its strip
// neighbours (rank−1 Above, rank+1 Below), in both directions at once.
// All ranks call Exchange the same number of times, in the same order.
//
// How it maps to the transports: the two links of a rank are exactly a
// pipeline stage's (pipeline/peerrpc: one bidirectional stream per
// neighbouring pair, opened by the upper rank, frames both ways, one
// sender and one receiver goroutine per end, bounded inboxes), so the
// gRPC Halo is a peerrpc-style link per neighbour carrying HaloFrames
// (their bytes are EncodeHaloFrame's, checked with DecodeHaloFrame and
// HaloFrame.Check). Over rings it takes two: the frames going down on
// a ring in rank order (SendRight to rank+1), those going up on a ring in
// reverse rank order; the wrap-around links carry empty frames.
type Halo interface {
	Rank() int
	Size() int
	// Exchange sends toAbove to rank−1 and toBelow to rank+1, and
	// receives rank−1's frame into fromAbove and rank+1's into fromBelow.
	// A side without a neighbour (rank 0's Above, the last rank's Below)
	// must be empty; an empty slice on a side that has a neighbour still
	// sends an empty frame, so every call is lockstep with both
	// neighbours. A frame whose group, sequence number, sender, side or
	// length is not the one expected is refused (it wraps
	// aggregator.ErrUnexpectedFrame) and never used; the link is then
	// broken and later calls fail. The slices are borrowed for the call.
	Exchange(ctx context.Context, toAbove, toBelow, fromAbove, fromBelow []float32) error
}

// HaloFrame is one message of a halo exchange: the rows one spatial rank
// sends a neighbour. Side is the receiver's side the frame comes from:
// Above for a frame sent down (from rank−1), Below for one sent up.
type HaloFrame struct {
	Group uint32 // the spatial group's id
	Seq   uint64 // the exchange's sequence number within the group, from 1
	From  uint32 // the sender's rank
	Side  Side
	Data  []float32
}

// haloHeader is the encoded header's length: group u32, seq u64, from
// u32, side u8, three zero bytes, count u32, all little-endian.
const haloHeader = 24

// MaxHaloValues bounds the values of one decoded frame (the 4 MiB frame
// limit of DESIGN.md's wire rules).
const MaxHaloValues = 1 << 20

// EncodeHaloFrame appends f's encoding to dst: a 24-byte header, then the
// values as little-endian float32.
func EncodeHaloFrame(dst []byte, f HaloFrame) []byte {
	var h [haloHeader]byte
	binary.LittleEndian.PutUint32(h[0:], f.Group)
	binary.LittleEndian.PutUint64(h[4:], f.Seq)
	binary.LittleEndian.PutUint32(h[12:], f.From)
	h[16] = uint8(f.Side)
	binary.LittleEndian.PutUint32(h[20:], uint32(len(f.Data)))
	dst = append(dst, h[:]...)
	for _, v := range f.Data {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// ErrBadHaloFrame is the error of bytes that are not a halo frame.
var ErrBadHaloFrame = errors.New("tensorpar: malformed halo frame")

// DecodeHaloFrame parses one frame; its Data is freshly allocated. Bytes
// that are not exactly one frame of at most MaxHaloValues values, or
// whose side or reserved bytes are invalid, are refused with an error
// wrapping ErrBadHaloFrame.
func DecodeHaloFrame(b []byte) (HaloFrame, error) {
	if len(b) < haloHeader {
		return HaloFrame{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadHaloFrame, len(b), haloHeader)
	}
	f := HaloFrame{
		Group: binary.LittleEndian.Uint32(b[0:]),
		Seq:   binary.LittleEndian.Uint64(b[4:]),
		From:  binary.LittleEndian.Uint32(b[12:]),
		Side:  Side(b[16]),
	}
	if f.Side != Above && f.Side != Below {
		return HaloFrame{}, fmt.Errorf("%w: side %d", ErrBadHaloFrame, b[16])
	}
	if b[17] != 0 || b[18] != 0 || b[19] != 0 {
		return HaloFrame{}, fmt.Errorf("%w: reserved bytes %v are not zero", ErrBadHaloFrame, b[17:20])
	}
	n := binary.LittleEndian.Uint32(b[20:])
	if n > MaxHaloValues {
		return HaloFrame{}, fmt.Errorf("%w: %d values, more than %d", ErrBadHaloFrame, n, MaxHaloValues)
	}
	if len(b)-haloHeader != 4*int(n) {
		return HaloFrame{}, fmt.Errorf("%w: %d data bytes for %d values", ErrBadHaloFrame, len(b)-haloHeader, n)
	}
	f.Data = make([]float32, n)
	for i := range f.Data {
		f.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[haloHeader+4*i:]))
	}
	return f, nil
}

// Check returns nil if f is the frame a receiver expects next: group
// want.Group, sequence want.Seq, sent by want.From, from side want.Side,
// carrying n values. Otherwise the error wraps
// aggregator.ErrUnexpectedFrame and says what differs.
func (f HaloFrame) Check(want HaloFrame, n int) error {
	switch {
	case f.Group != want.Group:
		return fmt.Errorf("tensorpar: halo frame of group %d, want group %d: %w", f.Group, want.Group, aggregator.ErrUnexpectedFrame)
	case f.From != want.From || f.Side != want.Side:
		return fmt.Errorf("tensorpar: halo frame from rank %d (%v), want rank %d (%v): %w", f.From, f.Side, want.From, want.Side, aggregator.ErrUnexpectedFrame)
	case f.Seq != want.Seq:
		return fmt.Errorf("tensorpar: halo frame of exchange %d, want exchange %d: %w", f.Seq, want.Seq, aggregator.ErrUnexpectedFrame)
	case len(f.Data) != n:
		return fmt.Errorf("tensorpar: halo frame of %d values from rank %d (%v), want %d: %w", len(f.Data), f.From, f.Side, n, aggregator.ErrUnexpectedFrame)
	}
	return nil
}

// MemHalo is an in-memory Halo for tests: one rank of a chain whose links
// are buffered channels of encoded frames, so every frame goes through
// EncodeHaloFrame, DecodeHaloFrame and Check as it would on a wire.
type MemHalo struct {
	rank, n int
	group   uint32
	// up and down are the links to rank−1 and rank+1 (nil at the ends);
	// in[s] is the link this rank receives side s's frames on.
	up, down chan []byte
	in       [3]chan []byte
	mu       sync.Mutex // serialises Exchange; guards seq and broken
	seq      uint64
	broken   error
}

// NewMemHalo connects f ranks of spatial group id in a chain; element i is
// rank i.
func NewMemHalo(f int, group uint32) []*MemHalo {
	if f < 1 {
		panic(fmt.Sprintf("tensorpar: NewMemHalo(%d): want f ≥ 1", f))
	}
	hs := make([]*MemHalo, f)
	for i := range hs {
		hs[i] = &MemHalo{rank: i, n: f, group: group}
	}
	for i := 0; i+1 < f; i++ {
		down, up := make(chan []byte, 2), make(chan []byte, 2)
		hs[i].down, hs[i+1].in[Above] = down, down
		hs[i+1].up, hs[i].in[Below] = up, up
	}
	return hs
}

// Rank implements Halo.
func (h *MemHalo) Rank() int { return h.rank }

// Size implements Halo.
func (h *MemHalo) Size() int { return h.n }

// Exchange implements Halo.
func (h *MemHalo) Exchange(ctx context.Context, toAbove, toBelow, fromAbove, fromBelow []float32) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.broken != nil {
		return fmt.Errorf("tensorpar: halo link broken earlier: %w", h.broken)
	}
	if err := h.exchange(ctx, toAbove, toBelow, fromAbove, fromBelow); err != nil {
		if errors.Is(err, aggregator.ErrUnexpectedFrame) || errors.Is(err, ErrBadHaloFrame) {
			h.broken = err
		}
		return err
	}
	return nil
}

func (h *MemHalo) exchange(ctx context.Context, toAbove, toBelow, fromAbove, fromBelow []float32) error {
	if (h.up == nil && (len(toAbove) > 0 || len(fromAbove) > 0)) || (h.down == nil && (len(toBelow) > 0 || len(fromBelow) > 0)) {
		return fmt.Errorf("tensorpar: halo rank %d of %d has no neighbour on a side it was given values for", h.rank, h.n)
	}
	h.seq++
	// Send both frames first: the links buffer two frames, so no rank
	// waits for a neighbour that is itself sending.
	for _, s := range []struct {
		link chan []byte
		side Side // the receiver's side
		data []float32
	}{{h.up, Below, toAbove}, {h.down, Above, toBelow}} {
		if s.link == nil {
			continue
		}
		b := EncodeHaloFrame(nil, HaloFrame{Group: h.group, Seq: h.seq, From: uint32(h.rank), Side: s.side, Data: s.data})
		select {
		case s.link <- b:
		case <-ctx.Done():
			return fmt.Errorf("tensorpar: halo rank %d sending %v: %w", h.rank, s.side, ctx.Err())
		}
	}
	for _, r := range []struct {
		side Side
		from int
		dst  []float32
	}{{Above, h.rank - 1, fromAbove}, {Below, h.rank + 1, fromBelow}} {
		link := h.in[r.side]
		if link == nil {
			continue
		}
		var b []byte
		select {
		case b = <-link:
		case <-ctx.Done():
			return fmt.Errorf("tensorpar: halo rank %d waiting for rank %d (%v): %w", h.rank, r.from, r.side, ctx.Err())
		}
		f, err := DecodeHaloFrame(b)
		if err != nil {
			return err
		}
		if err := f.Check(HaloFrame{Group: h.group, Seq: h.seq, From: uint32(r.from), Side: r.side}, len(r.dst)); err != nil {
			return err
		}
		copy(r.dst, f.Data)
	}
	return nil
}

// HaloCounts is the communication of a Halo: exchanges, and values sent
// to each side and received from each.
type HaloCounts struct {
	Exchanges            int64
	SentAbove, SentBelow int64
	RecvAbove, RecvBelow int64
}

// CountingHalo wraps a Halo and counts its calls.
type CountingHalo struct {
	Halo
	mu sync.Mutex
	c  HaloCounts // guarded by mu
}

// Counts returns the calls counted so far.
func (c *CountingHalo) Counts() HaloCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

// Reset zeroes the counts.
func (c *CountingHalo) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c = HaloCounts{}
}

// Exchange implements Halo.
func (c *CountingHalo) Exchange(ctx context.Context, toAbove, toBelow, fromAbove, fromBelow []float32) error {
	c.mu.Lock()
	c.c.Exchanges++
	c.c.SentAbove += int64(len(toAbove))
	c.c.SentBelow += int64(len(toBelow))
	c.c.RecvAbove += int64(len(fromAbove))
	c.c.RecvBelow += int64(len(fromBelow))
	c.mu.Unlock()
	return c.Halo.Exchange(ctx, toAbove, toBelow, fromAbove, fromBelow)
}
