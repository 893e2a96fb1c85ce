package shmring

import (
	"bytes"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
)

// FuzzDecodeSegment: the segment header decoder never panics, and what it
// accepts is a header that encodes back to the same bytes and describes
// a layout that fits the file.
func FuzzDecodeSegment(f *testing.F) {
	h := segHeader{Slots: 4, SlotSize: 4160, Generation: 3, From: 1, To: 2, Size: 3, PID: 42, Job: jobHash("j")}
	h.Total = segmentSize(h.Slots, h.SlotSize)
	h.MAC = h.mac([]byte("0123456789abcdef"))
	good := make([]byte, segHdrLen)
	h.encode(good)
	f.Add(good, uint32(h.Total))
	f.Add(good, uint32(4096))
	f.Add(good[:100], uint32(h.Total))
	f.Add(bytes.Repeat([]byte{0xff}, segHdrLen), uint32(1<<31))
	f.Fuzz(func(t *testing.T, b []byte, size uint32) {
		h, err := decodeSegment(b, int(size))
		if err != nil {
			return
		}
		if h.Total != int(size) || h.Total != segmentSize(h.Slots, h.SlotSize) || h.Slots < 1 || h.Slots > maxSlots ||
			h.SlotSize > maxSlotSize || h.SlotSize%line != 0 || h.To != (h.From+1)%h.Size {
			t.Fatalf("accepted an impossible layout: %+v", h)
		}
		again := make([]byte, segHdrLen)
		h.encode(again)
		if !bytes.Equal(again, b[:segHdrLen]) {
			t.Fatalf("decode/encode changed the header:\n%x\n%x", b[:segHdrLen], again)
		}
	})
}

// FuzzDecodeFrame: the frame header decoder never panics, never accepts
// more values than the slot holds, and what it accepts encodes back to
// the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	good := make([]byte, frameHdrLen)
	encodeFrame(good, aggregator.Frame{Generation: 2, Op: aggregator.OpAllReduce, Step: 9, Phase: 1, Chunk: 3, Offset: 100}, 7, 5)
	f.Add(good, uint64(5), uint32(64))
	f.Add(good, uint64(4), uint32(64))
	f.Add(good, uint64(5), uint32(6))
	f.Add(good[:10], uint64(0), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, seq uint64, max uint32) {
		fr, n, err := decodeFrame(b, seq, int(max))
		if err != nil {
			return
		}
		if n < 0 || n > int(max) || fr.Offset < 0 {
			t.Fatalf("accepted %d values (slot holds %d), offset %d", n, max, fr.Offset)
		}
		again := make([]byte, frameHdrLen)
		encodeFrame(again, fr, n, seq)
		if !bytes.Equal(again, b[:frameHdrLen]) {
			t.Fatalf("decode/encode changed the header:\n%x\n%x", b[:frameHdrLen], again)
		}
	})
}
