package shmring

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/gradsync/gradsync/aggregator"
)

// ErrCorrupt: a header in a shared segment (the segment's own, a frame's,
// or the ring counters) does not hold what the protocol allows. The data
// behind it is never used.
var ErrCorrupt = errors.New("shmring: corrupted shared memory")

// ErrRefused: a segment or an attach was not made with this job's secret
// (or names another job, generation or rank), so it is not used.
var ErrRefused = errors.New("shmring: refused")

// Segment layout (little-endian, offsets in bytes). The segment header
// is written once by the creator and only read afterwards; the control
// words each sit on their own 64-byte cache line so that the producer's
// and the consumer's stores do not share a line.
const (
	segMagic   = "GSSHMRNG"
	segVersion = 1

	offVersion  = 8
	offHdrBytes = 12
	offSlots    = 16
	offSlotSize = 20
	offTotal    = 24
	offGen      = 32
	offFrom     = 40
	offTo       = 44
	offSize     = 48
	offPID      = 52
	offNonce    = 56 // [16]byte
	offJob      = 72 // [32]byte: SHA-256 of the job id
	offMAC      = 104
	segHdrLen   = 136 // bytes covered by decodeSegment

	line = 64 // a cache line
	// Control lines (each a multiple of line):
	offHead         = 512       // u64, written by the producer: frames published
	offTail         = 512 + 64  // u64, written by the consumer: frames consumed
	offDataSeq      = 512 + 128 // u32 futex word the consumer sleeps on; u32 at +4: it is asleep
	offSpaceSeq     = 512 + 192 // u32 futex word the producer sleeps on; u32 at +4: it is asleep
	offProdClosed   = 512 + 256 // u32: the producer closed its end; u32 at +4: the consumer did
	offAttach       = 512 + 320 // u32 futex word: attachNone, attachDone, attachAccepted, attachRefused
	offAttacherPID  = offAttach + 4
	offAttacherRank = offAttach + 8
	offToken        = 512 + 384 // [32]byte: the attacher's proof of the secret
	offPublished    = 512 + 448 // u64: Unix nanoseconds of the producer's last publish (statistics only)

	// dataOff is where the slots start (a page, so that payloads are
	// aligned for float32 and for copying).
	dataOff = 4096

	frameHdrLen = 64
	// maxSlots bounds a segment's slots; minSlotSize fits one value.
	maxSlots    = 64
	maxSlotSize = frameHdrLen + 4*aggregator.MaxFrameElemsLimit
)

// Attach states (the word at offAttach).
const (
	attachNone     = 0
	attachDone     = 1 // the attacher wrote its pid, rank and token
	attachAccepted = 2 // the creator checked the token
	attachRefused  = 3
)

// segHeader is the fixed header of one segment: the directed link from
// rank From to rank To of a ring of Size ranks.
type segHeader struct {
	Slots, SlotSize int // SlotSize includes the frame header
	Total           int // the segment's size in bytes
	Generation      uint64
	From, To, Size  int
	PID             int // the creator's process
	Nonce           [16]byte
	Job             [32]byte
	MAC             [32]byte
}

func jobHash(job string) [32]byte { return sha256.Sum256([]byte(job)) }

// segmentSize is the size of a segment of slots slots of slotSize bytes.
func segmentSize(slots, slotSize int) int { return dataOff + slots*slotSize }

// encode writes h into b[:segHdrLen], MAC included.
func (h *segHeader) encode(b []byte) {
	le := binary.LittleEndian
	copy(b, segMagic)
	le.PutUint32(b[offVersion:], segVersion)
	le.PutUint32(b[offHdrBytes:], dataOff)
	le.PutUint32(b[offSlots:], uint32(h.Slots))
	le.PutUint32(b[offSlotSize:], uint32(h.SlotSize))
	le.PutUint64(b[offTotal:], uint64(h.Total))
	le.PutUint64(b[offGen:], h.Generation)
	le.PutUint32(b[offFrom:], uint32(h.From))
	le.PutUint32(b[offTo:], uint32(h.To))
	le.PutUint32(b[offSize:], uint32(h.Size))
	le.PutUint32(b[offPID:], uint32(h.PID))
	copy(b[offNonce:], h.Nonce[:])
	copy(b[offJob:], h.Job[:])
	copy(b[offMAC:], h.MAC[:])
}

// decodeSegment parses and checks a segment header in b (at least
// segHdrLen bytes of it) of a segment whose file is size bytes long. It
// checks the structure only; verify checks the MAC.
func decodeSegment(b []byte, size int) (segHeader, error) {
	var h segHeader
	if len(b) < segHdrLen {
		return h, fmt.Errorf("%w: segment header of %d bytes, want %d", ErrCorrupt, len(b), segHdrLen)
	}
	le := binary.LittleEndian
	if string(b[:len(segMagic)]) != segMagic {
		return h, fmt.Errorf("%w: not a gradsync ring segment (magic %q)", ErrCorrupt, b[:len(segMagic)])
	}
	if v := le.Uint32(b[offVersion:]); v != segVersion {
		return h, fmt.Errorf("%w: segment version %d, this build speaks %d", ErrCorrupt, v, segVersion)
	}
	if d := le.Uint32(b[offHdrBytes:]); d != dataOff {
		return h, fmt.Errorf("%w: data offset %d, want %d", ErrCorrupt, d, dataOff)
	}
	slots, slotSize := le.Uint32(b[offSlots:]), le.Uint32(b[offSlotSize:])
	if slots < 1 || slots > maxSlots {
		return h, fmt.Errorf("%w: %d slots, want 1 to %d", ErrCorrupt, slots, maxSlots)
	}
	if slotSize < frameHdrLen+line || slotSize > maxSlotSize || slotSize%line != 0 {
		return h, fmt.Errorf("%w: slot size %d, want a multiple of %d in [%d, %d]", ErrCorrupt, slotSize, line, frameHdrLen+line, maxSlotSize)
	}
	h.Slots, h.SlotSize = int(slots), int(slotSize)
	total := le.Uint64(b[offTotal:])
	if want := uint64(segmentSize(h.Slots, h.SlotSize)); total != want || total != uint64(size) {
		return h, fmt.Errorf("%w: segment claims %d bytes, its layout needs %d and the file has %d", ErrCorrupt, total, want, size)
	}
	h.Total = int(total)
	h.Generation = le.Uint64(b[offGen:])
	from, to, n := le.Uint32(b[offFrom:]), le.Uint32(b[offTo:]), le.Uint32(b[offSize:])
	if n < 2 || n > maxRanks || from >= n || to != (from+1)%n {
		return h, fmt.Errorf("%w: link %d → %d in a ring of %d ranks", ErrCorrupt, from, to, n)
	}
	h.From, h.To, h.Size = int(from), int(to), int(n)
	pid := le.Uint32(b[offPID:])
	if pid == 0 || pid > 1<<30 {
		return h, fmt.Errorf("%w: creator pid %d", ErrCorrupt, pid)
	}
	h.PID = int(pid)
	copy(h.Nonce[:], b[offNonce:])
	copy(h.Job[:], b[offJob:])
	copy(h.MAC[:], b[offMAC:])
	return h, nil
}

// mac is the header's authenticator: HMAC-SHA256 under the job secret of
// every header field before it.
func (h *segHeader) mac(secret []byte) [32]byte {
	var b [segHdrLen]byte
	c := *h
	c.MAC = [32]byte{}
	c.encode(b[:])
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("gradsync shmring segment v1\x00"))
	m.Write(b[:offMAC])
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}

// token is what an attacher of rank rank, process pid writes into the
// segment with nonce to prove that it holds the job secret.
func token(secret []byte, nonce [16]byte, rank, pid int) [32]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("gradsync shmring attach v1\x00"))
	m.Write(nonce[:])
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:], uint32(rank))
	binary.LittleEndian.PutUint32(b[4:], uint32(pid))
	m.Write(b[:])
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}

// Frame header layout inside a slot.
const (
	frameMagic  = 0x52464347 // "GCFR" little-endian
	fOffOp      = 4
	fOffSeq     = 8
	fOffGen     = 16
	fOffStep    = 24
	fOffPhase   = 32
	fOffChunk   = 36
	fOffOffset  = 40
	fOffN       = 48
	fOffCRC     = 56
	fCRCCovered = fOffCRC
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeFrame writes the header of f (n values, the seq-th frame on the
// link) into b[:frameHdrLen].
func encodeFrame(b []byte, f aggregator.Frame, n int, seq uint64) {
	le := binary.LittleEndian
	clear(b[:frameHdrLen])
	le.PutUint32(b, frameMagic)
	b[fOffOp] = byte(f.Op)
	le.PutUint64(b[fOffSeq:], seq)
	le.PutUint64(b[fOffGen:], f.Generation)
	le.PutUint64(b[fOffStep:], uint64(f.Step))
	le.PutUint32(b[fOffPhase:], f.Phase)
	le.PutUint32(b[fOffChunk:], f.Chunk)
	le.PutUint64(b[fOffOffset:], uint64(f.Offset))
	le.PutUint32(b[fOffN:], uint32(n))
	le.PutUint32(b[fOffCRC:], frameCRC(b))
}

// frameCRC is the checksum of the frame header in b.
func frameCRC(b []byte) uint32 { return crc32.Checksum(b[:fCRCCovered], castagnoli) }

// decodeFrame parses the header in b (frameHdrLen bytes) of the frame
// expected to be the seq-th on its link, whose slot holds at most max
// values. It returns the frame's tags (Data nil) and its value count.
func decodeFrame(b []byte, seq uint64, max int) (aggregator.Frame, int, error) {
	if len(b) < frameHdrLen {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame header of %d bytes, want %d", ErrCorrupt, len(b), frameHdrLen)
	}
	le := binary.LittleEndian
	if m := le.Uint32(b); m != frameMagic {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d: bad magic %#x", ErrCorrupt, seq, m)
	}
	if c, want := le.Uint32(b[fOffCRC:]), frameCRC(b); c != want {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d: header checksum %#x, computed %#x", ErrCorrupt, seq, c, want)
	}
	for _, r := range [][]byte{b[fOffOp+1 : fOffSeq], b[fOffN+4 : fOffCRC], b[fOffCRC+4 : frameHdrLen]} {
		if !allZero(r) {
			return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d: reserved header bytes are not zero", ErrCorrupt, seq)
		}
	}
	if s := le.Uint64(b[fOffSeq:]); s != seq {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d carries sequence number %d", ErrCorrupt, seq, s)
	}
	n := le.Uint32(b[fOffN:])
	if uint64(n) > uint64(max) {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d claims %d values; its slot holds %d", ErrCorrupt, seq, n, max)
	}
	off := le.Uint64(b[fOffOffset:])
	if off > 1<<62 {
		return aggregator.Frame{}, 0, fmt.Errorf("%w: frame %d: offset %d", ErrCorrupt, seq, off)
	}
	f := aggregator.Frame{
		Op:         aggregator.OpKind(b[fOffOp]),
		Generation: le.Uint64(b[fOffGen:]),
		Step:       int64(le.Uint64(b[fOffStep:])),
		Phase:      le.Uint32(b[fOffPhase:]),
		Chunk:      le.Uint32(b[fOffChunk:]),
		Offset:     int(off),
	}
	return f, int(n), nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
