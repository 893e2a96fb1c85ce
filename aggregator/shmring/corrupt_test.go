//go:build linux

package shmring

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
)

var testSecret = []byte("0123456789abcdef-job-secret")

// pair connects a ring of two ranks in this process over segments in a
// temporary directory, with the default number of slots.
func pair(t *testing.T) [2]*Ring { return pairSlots(t, 0) }

// TestCorruptFrame: whatever is wrong with a frame's header in the shared
// segment (or with the ring counters), the receiver refuses it with
// ErrCorrupt naming the sender, and never adds a value from it.
func TestCorruptFrame(t *testing.T) {
	le := binary.LittleEndian
	for _, tc := range []struct {
		name    string
		corrupt func(l *link, hdr []byte)
		want    string
	}{
		{"flipped bit", func(_ *link, hdr []byte) { hdr[fOffStep] ^= 4 }, "checksum"},
		{"magic", func(_ *link, hdr []byte) { hdr[0] = 'x' }, "magic"},
		{"too many values", func(_ *link, hdr []byte) {
			le.PutUint32(hdr[fOffN:], 1<<20)
			le.PutUint32(hdr[fOffCRC:], frameCRC(hdr))
		}, "slot holds"},
		{"sequence", func(_ *link, hdr []byte) {
			le.PutUint64(hdr[fOffSeq:], 5)
			le.PutUint32(hdr[fOffCRC:], frameCRC(hdr))
		}, "sequence number 5"},
		{"head ahead", func(l *link, _ []byte) { l.head.Store(1000) }, "1000 frames published"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := pair(t)
			vals := []float32{1, 2, 3, 4}
			if err := rings[0].SendRight(t.Context(), aggregator.Frame{Op: aggregator.OpAllReduce, Step: 1, Data: vals}); err != nil {
				t.Fatal(err)
			}
			in := rings[1].in
			hdr, _ := in.slot(0)
			tc.corrupt(in, hdr)
			dst := []float32{10, 20, 30, 40}
			accepted := false
			err := rings[1].RecvLeftInto(t.Context(), dst, true, func(aggregator.Frame, int) error { accepted = true; return nil })
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("RecvLeftInto: %v, want ErrCorrupt saying %q", err, tc.want)
			}
			if pe := new(aggregator.PeerError); !errors.As(err, &pe) || pe.Rank != 0 {
				t.Errorf("%v does not name rank 0", err)
			}
			if accepted || dst[0] != 10 || dst[3] != 40 {
				t.Errorf("the corrupted frame was used: accepted %v, dst %v", accepted, dst)
			}
			if _, err := rings[1].RecvLeft(t.Context()); !errors.Is(err, ErrCorrupt) {
				t.Errorf("RecvLeft: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestTailAhead: a receiver that claims to have taken frames never sent
// makes the sender fail with ErrCorrupt rather than overwrite slots.
func TestTailAhead(t *testing.T) {
	rings := pair(t)
	rings[0].out.tail.Store(7)
	err := rings[0].SendRight(t.Context(), aggregator.Frame{Data: []float32{1}})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("SendRight: %v, want ErrCorrupt", err)
	}
}

// TestIntruderRefused: a process that can open the segment (same user)
// but does not hold the job secret writes a forged attach; the creator
// refuses it, says so in its log and error, and never connects.
func TestIntruderRefused(t *testing.T) {
	dir := t.TempDir()
	var logs LogBuffer
	p, offer, err := Create(Config{Dir: dir, JobID: "j", Rank: 0, Size: 2, Secret: testSecret, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p1, offer1, err := Create(Config{Dir: dir, JobID: "j", Rank: 1, Size: 2, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	// The intruder maps the segment and writes a token made with a
	// secret of its own, claiming to be rank 1.
	f, err := os.OpenFile(filepath.Join(dir, offer.Name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	mem, err := mapFile(f, int(fi.Size()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer unmap(mem)
	h, err := decodeSegment(mem, len(mem))
	if err != nil {
		t.Fatal(err)
	}
	tok := token([]byte("not the job's secret at all...."), h.Nonce, 1, os.Getpid())
	copy(mem[offToken:], tok[:])
	word(mem, offAttacherPID).Store(uint32(os.Getpid()))
	word(mem, offAttacherRank).Store(1)
	word(mem, offAttach).Store(attachDone)
	futexWake(word(mem, offAttach))

	// Rank 0 attaches rank 1's (real) segment, then finds the intruder's
	// attach on its own.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
	defer cancel()
	if r, err := p.Connect(ctx, offer1); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "does not hold this job's secret") {
		if r != nil {
			r.Close()
		}
		t.Fatalf("Connect: %v, want ErrRefused saying the secret is missing", err)
	}
	if s := word(mem, offAttach).Load(); s != attachRefused {
		t.Errorf("attach state %d, want refused (%d)", s, attachRefused)
	}
	if !strings.Contains(logs.String(), "attach refused") {
		t.Errorf("no refusal logged: %q", logs.String())
	}
}

// TestCorruptSegmentHeader: a segment whose header was damaged before
// the neighbour attached is refused: a broken layout with ErrCorrupt, a
// changed field (the layout still sound) by its MAC with ErrRefused.
func TestCorruptSegmentHeader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(b []byte)
		want    error
		why     string
	}{
		{"slots", func(b []byte) { binary.LittleEndian.PutUint32(b[offSlots:], 0) }, ErrCorrupt, "0 slots"},
		{"size", func(b []byte) { binary.LittleEndian.PutUint64(b[offTotal:], 1<<40) }, ErrCorrupt, "claims"},
		{"magic", func(b []byte) { b[0] = 'X' }, ErrCorrupt, "not a gradsync ring segment"},
		{"generation", func(b []byte) { b[offGen] ^= 1 }, ErrRefused, "secret"},
		{"mac", func(b []byte) { b[offMAC+5] ^= 0x80 }, ErrRefused, "secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p1, o1, err := Create(Config{Dir: dir, JobID: "j", Rank: 1, Size: 2, Secret: testSecret, MaxFrameElems: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer p1.Close()
			p0, _, err := Create(Config{Dir: dir, JobID: "j", Rank: 0, Size: 2, Secret: testSecret, MaxFrameElems: 64})
			if err != nil {
				t.Fatal(err)
			}
			tc.corrupt(p1.out.mem)
			r, err := p0.Connect(t.Context(), o1)
			if r != nil {
				r.Close()
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("Connect: %v, want %v saying %q", err, tc.want, tc.why)
			}
		})
	}
}
