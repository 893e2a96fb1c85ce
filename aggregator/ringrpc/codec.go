package ringrpc

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// codecName is the content subtype of streams between rings
// ("application/grpc+gradsyncframes"). The bytes on the wire are exactly
// pb.SendFramesRequest's protobuf encoding; only the Go side differs.
const codecName = "gradsyncframes"

func init() { encoding.RegisterCodecV2(codec{}) }

// codec encodes *outFrame and decodes into *inFrame without the generic
// proto machinery (no intermediate []byte per frame, no float conversion on
// little-endian machines); every other message goes to the proto codec.
type codec struct{}

func (codec) Name() string { return codecName }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	o, ok := v.(*outFrame)
	if !ok {
		return protoCodec().Marshal(v)
	}
	b := mem.NewBuffer(&o.buf, o)
	if _, plain := b.(mem.SliceBuffer); plain {
		// Not reference counted (too small for gRPC's pooling), so gRPC
		// would not tell us when it is done: hand it a copy instead.
		c := bytes.Clone(o.buf)
		o.Put(nil)
		return mem.BufferSlice{mem.SliceBuffer(c)}, nil
	}
	return mem.BufferSlice{b}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	in, ok := v.(*inFrame)
	if !ok {
		return protoCodec().Unmarshal(data, v)
	}
	return in.decode(data)
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(encproto.Name) }

// minOutCap keeps encode buffers well above gRPC's pooling threshold, so
// that gRPC reference-counts them and returns them through Put.
const minOutCap = 64 << 10

// outFrame is one encoded SendFramesRequest on its way out. It is its own
// mem.BufferPool: gRPC calls Put once it has written the bytes, which puts
// the frame back on its ring's free list.
type outFrame struct {
	buf  []byte           // the encoded message; the backing array is reused
	hdr  []byte           // scratch for the tag fields
	free chan<- *outFrame // the owner's free list, with room for every outFrame
}

// Get implements mem.BufferPool; gRPC only Puts our buffers back.
func (o *outFrame) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put implements mem.BufferPool: gRPC is done with o.buf.
func (o *outFrame) Put(*[]byte) {
	select {
	case o.free <- o:
	default: // cannot happen: the free list holds every outFrame
	}
}

// encode writes f as a SendFramesRequest: the tag fields first, the data
// last, copied once from f.Data.
func (o *outFrame) encode(job string, rank int, f aggregator.Frame) {
	h := o.hdr[:0]
	h = protowire.AppendTag(h, 1, protowire.BytesType)
	h = protowire.AppendString(h, job)
	h = appendVarintField(h, 2, f.Generation)
	h = appendVarintField(h, 3, uint64(opToPB(f.Op)))
	h = appendVarintField(h, 4, uint64(f.Step))
	h = appendVarintField(h, 5, uint64(f.Phase))
	h = appendVarintField(h, 6, uint64(f.Chunk))
	h = appendVarintField(h, 7, uint64(f.Offset))
	h = appendVarintField(h, 9, uint64(pb.DType_D_TYPE_F32))
	h = appendVarintField(h, 12, uint64(int64(rank)))
	o.hdr = h
	nb := 4 * len(f.Data)
	inner := len(h)
	if nb > 0 {
		inner += protowire.SizeTag(10) + protowire.SizeBytes(nb)
	}
	need := protowire.SizeTag(1) + protowire.SizeBytes(inner)
	if cap(o.buf) < need {
		o.buf = make([]byte, 0, max(need, minOutCap))
	}
	b := o.buf[:0]
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = append(b, h...)
	if nb > 0 {
		b = protowire.AppendTag(b, 10, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(nb))
		b = appendF32(b, f.Data)
	}
	o.buf = b
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // proto3: defaults are not sent
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// inFrame is one received frame: its tags and its data decoded into a
// buffer that is reused from frame to frame.
type inFrame struct {
	job     []byte // reused; compared with the ring's job id without allocating
	gen     uint64
	op      pb.Op
	step    int64
	phase   uint32
	chunk   uint32
	offset  uint64
	dtype   pb.DType
	rank    int32
	nbytes  int       // length of the data field in bytes
	data    []float32 // the values: store[:nbytes/4], nil if nbytes%4 != 0
	store   []float32 // backing array of data, grown as needed
	hasData bool
}

func (in *inFrame) reset() {
	*in = inFrame{job: in.job[:0], store: in.store}
}

// frame is the aggregator view of in; Data aliases in's buffer.
func (in *inFrame) frame() aggregator.Frame {
	return aggregator.Frame{
		Generation: in.gen, Op: opFromPB(in.op), Step: in.step, Phase: in.phase,
		Chunk: in.chunk, Offset: int(in.offset), Data: in.data,
	}
}

// dataBuf returns in.store resized to n elements.
func (in *inFrame) dataBuf(n int) []float32 {
	if cap(in.store) < n {
		in.store = make([]float32, n)
	}
	return in.store[:n]
}

// fromProto fills in from a message decoded by the ordinary proto codec
// (a client that does not use our content subtype).
func (in *inFrame) fromProto(req *pb.SendFramesRequest) {
	in.reset()
	f := req.GetFrame()
	in.job = append(in.job, f.GetJobId()...)
	in.gen, in.op, in.step, in.phase, in.chunk = f.GetGeneration(), f.GetOp(), f.GetStep(), f.GetPhase(), f.GetChunk()
	in.offset, in.dtype, in.rank = f.GetOffset(), f.GetDtype(), f.GetRank()
	in.nbytes = len(f.GetData())
	if in.nbytes%4 == 0 {
		in.data = in.dataBuf(in.nbytes / 4)
		_ = wire.GetF32(in.data, f.GetData()) // lengths match
	}
}

var errMalformed = errors.New("ringrpc: malformed SendFramesRequest")

// decode parses a SendFramesRequest from gRPC's receive buffers.
func (in *inFrame) decode(s mem.BufferSlice) error {
	in.reset()
	c := cursor{s: s, n: s.Len()}
	for c.n > 0 && c.err == nil {
		num, typ := c.tag()
		if num == 1 && typ == protowire.BytesType {
			l := c.varint()
			if l > uint64(c.n) {
				return errMalformed
			}
			in.decodeFrame(&c, c.n-int(l))
			continue
		}
		c.skip(typ)
	}
	if c.err != nil {
		return fmt.Errorf("%w: %v", errMalformed, c.err)
	}
	return nil
}

// decodeFrame parses TensorFrame fields until c has end bytes left.
func (in *inFrame) decodeFrame(c *cursor, end int) {
	for c.n > end && c.err == nil {
		num, typ := c.tag()
		if typ == protowire.VarintType && num != 1 && num != 10 {
			v := c.varint()
			switch num {
			case 2:
				in.gen = v
			case 3:
				in.op = pb.Op(int32(v))
			case 4:
				in.step = int64(v)
			case 5:
				in.phase = uint32(v)
			case 6:
				in.chunk = uint32(v)
			case 7:
				in.offset = v
			case 9:
				in.dtype = pb.DType(int32(v))
			case 12:
				in.rank = int32(v)
			}
			continue
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			l := c.varint()
			if l > uint64(c.n-end) || l > 1<<10 {
				c.fail(errMalformed)
				return
			}
			in.job = in.job[:0]
			for range l {
				in.job = append(in.job, c.byte())
			}
		case num == 10 && typ == protowire.BytesType:
			l := c.varint()
			if l > uint64(c.n-end) || l > wire.MaxFrameBytes {
				c.fail(fmt.Errorf("data field of %d bytes; at most %d allowed", l, wire.MaxFrameBytes))
				return
			}
			in.nbytes, in.hasData = int(l), true
			if l%4 != 0 {
				in.data = nil
				c.discard(int(l))
				continue
			}
			in.data = in.dataBuf(int(l / 4))
			readF32(c, in.data)
		default:
			c.skip(typ)
		}
	}
	if c.n < end {
		c.fail(errMalformed)
	}
}

// cursor reads protobuf wire data across the pieces of a BufferSlice
// without copying them into one buffer.
type cursor struct {
	s   mem.BufferSlice
	i   int // current piece
	off int // offset in the current piece
	n   int // bytes left in total
	err error
}

func (c *cursor) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.n = 0
}

func (c *cursor) byte() byte {
	for c.n > 0 && c.i < len(c.s) {
		d := c.s[c.i].ReadOnlyData()
		if c.off < len(d) {
			b := d[c.off]
			c.off++
			c.n--
			return b
		}
		c.i, c.off = c.i+1, 0
	}
	c.fail(io.ErrUnexpectedEOF)
	return 0
}

func (c *cursor) read(dst []byte) {
	for len(dst) > 0 {
		if c.n <= 0 || c.i >= len(c.s) {
			c.fail(io.ErrUnexpectedEOF)
			clear(dst)
			return
		}
		d := c.s[c.i].ReadOnlyData()[c.off:]
		k := copy(dst, d)
		dst, c.off, c.n = dst[k:], c.off+k, c.n-k
		if k == len(d) {
			c.i, c.off = c.i+1, 0
		}
	}
}

func (c *cursor) discard(k int) {
	for k > 0 {
		if c.n <= 0 || c.i >= len(c.s) {
			c.fail(io.ErrUnexpectedEOF)
			return
		}
		d := len(c.s[c.i].ReadOnlyData()) - c.off
		m := min(k, d)
		k, c.off, c.n = k-m, c.off+m, c.n-m
		if m == d {
			c.i, c.off = c.i+1, 0
		}
	}
}

func (c *cursor) varint() uint64 {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b := c.byte()
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	c.fail(errMalformed)
	return 0
}

func (c *cursor) tag() (protowire.Number, protowire.Type) {
	num, typ := protowire.DecodeTag(c.varint())
	if num <= 0 {
		c.fail(errMalformed)
	}
	return num, typ
}

func (c *cursor) skip(typ protowire.Type) {
	switch typ {
	case protowire.VarintType:
		c.varint()
	case protowire.Fixed32Type:
		c.discard(4)
	case protowire.Fixed64Type:
		c.discard(8)
	case protowire.BytesType:
		l := c.varint()
		if l > uint64(c.n) {
			c.fail(errMalformed)
			return
		}
		c.discard(int(l))
	default:
		c.fail(fmt.Errorf("unsupported wire type %d", typ))
	}
}

func opToPB(o aggregator.OpKind) pb.Op {
	switch o {
	case aggregator.OpAllReduce:
		return pb.Op_OP_ALL_REDUCE
	case aggregator.OpAllGather:
		return pb.Op_OP_ALL_GATHER
	case aggregator.OpBroadcast:
		return pb.Op_OP_BROADCAST
	case aggregator.OpBarrier:
		return pb.Op_OP_BARRIER
	}
	return pb.Op_OP_UNSPECIFIED
}

func opFromPB(o pb.Op) aggregator.OpKind {
	switch o {
	case pb.Op_OP_ALL_REDUCE:
		return aggregator.OpAllReduce
	case pb.Op_OP_ALL_GATHER:
		return aggregator.OpAllGather
	case pb.Op_OP_BROADCAST:
		return aggregator.OpBroadcast
	case pb.Op_OP_BARRIER:
		return aggregator.OpBarrier
	}
	return aggregator.OpInvalid
}
