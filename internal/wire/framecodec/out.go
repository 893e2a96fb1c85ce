package framecodec

import (
	"bytes"
	"context"
	"math"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// GRPCPrefix is the length of gRPC's message prefix (compression flag and
// length) in front of every message on the wire.
const GRPCPrefix = 5

// ReleaseGrace is how long a send that gives up (its context ended, or
// the stream broke) still waits for gRPC to finish with the caller's
// data. A peer that reads takes about a millisecond per MiB; one that
// does not will not take it any sooner.
const ReleaseGrace = 100 * time.Millisecond

// Out is one outgoing message that carries a TensorFrame whose float32
// values go without copying: Marshal hands gRPC the encoded fields
// followed by the caller's values themselves (viewed as little-endian
// bytes; converted on big-endian machines). gRPC reference-counts the
// values' buffer with Out as its mem.BufferPool, so Put tells when gRPC
// has written every byte and the caller's slice may change again
// (Released). An Out is reused message after message, but only once the
// previous one was released.
type Out struct {
	hdr  []byte // the message's bytes before the values; reused
	tags []byte // scratch for the TensorFrame's other fields
	data []byte // the values' bytes: aliases the caller's []float32 on little-endian machines
	// released receives one value when gRPC is done with data (Put).
	released chan struct{}
}

// NewOut returns an idle Out.
func NewOut() *Out { return &Out{released: make(chan struct{}, 1)} }

// Get implements mem.BufferPool; gRPC only Puts our buffers back.
func (o *Out) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put implements mem.BufferPool: gRPC is done with o's data.
func (o *Out) Put(*[]byte) { o.released <- struct{}{} }

// Released receives one value once gRPC is done with the values of the
// message last marshalled.
func (o *Out) Released() <-chan struct{} { return o.released }

// Header and Data are the encoded message's two parts (the values
// follow the header); for tests.
func (o *Out) Header() []byte { return o.hdr }

// Data is the values' bytes (see Header).
func (o *Out) Data() []byte { return o.data }

// Encode prepares a message: prefix (the enclosing message's other
// fields, already encoded), then as field num of the enclosing message a
// TensorFrame holding tf's fields other than data, and vals as its data.
// vals must stay unchanged until gRPC is done with them (Released).
//
// The data field's length is written with 0–3 redundant varint bytes (a
// valid protobuf encoding that every parser reads as the same number) so
// that the values start 4-byte aligned after gRPC's 5-byte message prefix:
// the receiver then finds them aligned in its frame buffers and sums them
// as float32 directly.
func (o *Out) Encode(prefix []byte, num protowire.Number, tf *pb.TensorFrame, vals []float32) {
	o.tags = AppendTags(o.tags[:0], tf)
	nb := 4 * len(vals)
	var h []byte
	for pad := 0; pad < 4; pad++ {
		inner := len(o.tags)
		if nb > 0 {
			inner += protowire.SizeTag(10) + protowire.SizeVarint(uint64(nb)) + pad + nb
		}
		h = append(o.hdr[:0], prefix...)
		h = protowire.AppendTag(h, num, protowire.BytesType)
		h = protowire.AppendVarint(h, uint64(inner))
		h = append(h, o.tags...)
		if nb == 0 {
			break
		}
		h = protowire.AppendTag(h, 10, protowire.BytesType)
		h = appendPaddedVarint(h, uint64(nb), pad)
		if (GRPCPrefix+len(h))%4 == 0 {
			break
		}
	}
	o.hdr = h
	o.data = f32Wire(o.data, vals)
}

// appendPaddedVarint appends v as a varint that is pad bytes longer than
// the shortest encoding (continuation bits over zero groups).
func appendPaddedVarint(b []byte, v uint64, pad int) []byte {
	n := protowire.SizeVarint(v) + pad
	for range n - 1 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// AppendTags appends the fields of tf other than data to b, as protobuf
// encodes them (in field order, defaults left out).
func AppendTags(b []byte, tf *pb.TensorFrame) []byte {
	if tf.JobId != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, tf.JobId)
	}
	b = appendVarintField(b, 2, tf.Generation)
	b = appendVarintField(b, 3, uint64(tf.Op))
	b = appendVarintField(b, 4, uint64(tf.Step))
	b = appendVarintField(b, 5, uint64(tf.Phase))
	b = appendVarintField(b, 6, uint64(tf.Chunk))
	b = appendVarintField(b, 7, tf.Offset)
	b = appendVarintField(b, 8, tf.Total)
	b = appendVarintField(b, 9, uint64(tf.Dtype))
	if tf.Scale != 0 || math.Signbit(float64(tf.Scale)) {
		b = protowire.AppendTag(b, 11, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(tf.Scale))
	}
	b = appendVarintField(b, 12, uint64(int64(tf.Rank)))
	if tf.Last {
		b = appendVarintField(b, 13, 1)
	}
	if len(tf.Scales) > 0 {
		b = protowire.AppendTag(b, 14, protowire.BytesType)
		b = protowire.AppendBytes(b, tf.Scales)
	}
	b = appendVarintField(b, 15, uint64(tf.ScaleChunk))
	b = appendVarintField(b, 16, tf.Span)
	return b
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // proto3: defaults are not sent
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// MarshalFrames returns the encoded message for gRPC (see Marshaler). A
// data buffer too small for gRPC's reference counting is copied (gRPC
// would not Put it), and Released is signalled at once, as it is for a
// message without values.
func (o *Out) MarshalFrames() mem.BufferSlice {
	hdr := mem.SliceBuffer(bytes.Clone(o.hdr))
	if len(o.data) == 0 {
		o.released <- struct{}{}
		return mem.BufferSlice{hdr}
	}
	b := mem.NewBuffer(&o.data, o)
	if _, plain := b.(mem.SliceBuffer); plain {
		b = mem.SliceBuffer(bytes.Clone(o.data))
		o.released <- struct{}{}
	}
	return mem.BufferSlice{hdr, b}
}

// Stream is the sending half of a gRPC stream (client or server).
type Stream interface {
	SendMsg(m any) error
}

// Sender sends float32 frames on one stream without copying them; its
// methods are not safe for concurrent use.
type Sender struct {
	spare *Out // idle; nil after a send gRPC did not let go of
}

// Send sends one message (see Out.Encode for prefix, num, tf and vals) on
// s, whose codec must be this package's, and returns once gRPC is done
// with vals, so the caller may change them again. If ctx ends or the
// stream fails first, Send waits up to ReleaseGrace for gRPC to let go of
// vals and returns the error; past that, gRPC may still read vals until
// the stream is cleaned up (a stream that failed carries nothing anyone
// uses).
func (s *Sender) Send(ctx context.Context, st Stream, prefix []byte, num protowire.Number, tf *pb.TensorFrame, vals []float32) error {
	o := s.spare
	if o == nil {
		o = NewOut()
	}
	s.spare = nil
	o.Encode(prefix, num, tf, vals)
	err := st.SendMsg(o)
	if err == nil {
		select {
		case <-o.released:
			s.spare = o
			return nil
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
	}
	t := time.NewTimer(ReleaseGrace)
	defer t.Stop()
	select {
	case <-o.released:
		s.spare = o
	case <-t.C: // o stays with gRPC
	}
	return err
}
