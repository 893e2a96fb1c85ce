// Package framecodec moves float32 tensor frames through gRPC without
// the generic protobuf machinery and without copying their values: the
// codec of the ring collectives (aggregator/ringrpc) and of the
// parameter server's push/pull streams (paramserver, worker).
//
// # Codec
//
// Streams that carry frames use the gRPC codec registered under the
// content subtype Name ("application/grpc+gradsyncframes"). The bytes on
// the wire are exactly the protobuf encoding of the stream's messages
// (pb.SendFramesRequest, pb.SyncRequest, pb.SyncResponse); only the Go
// side differs:
//
//   - a message that implements Marshaler (Out) is written as a few
//     bytes of fields followed by the sender's []float32 itself: gRPC
//     reference-counts it and says when it has written it (Out.Released),
//     and only then may the sender change the values (Sender.Send waits
//     for that). The data field's length is padded with redundant varint
//     bytes so that the values arrive 4-byte aligned.
//   - a message that implements Unmarshaler (SyncRequest, SyncResponse,
//     the ring's frames) is parsed straight from gRPC's receive buffers;
//     a frame's values stay there (referenced) until they are added or
//     copied into their destination (Frame.CombineInto) or decoded
//     (Frame.Values).
//   - every other message goes to the ordinary proto codec.
//
// The decoders accept any valid protobuf encoding (any field order,
// repeated fields, unknown fields, unpadded lengths), so peers that use
// the plain proto codec interoperate in both directions; a server tells
// which codec a stream's client chose with InUse. On little-endian
// machines float32 slices are viewed as bytes without conversion (see
// endian_le.go); elsewhere they are converted with internal/wire.
package framecodec

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
)

// Name is the content subtype of streams that use this package's codec.
const Name = "gradsyncframes"

func init() { encoding.RegisterCodecV2(codec{}) }

// Marshaler is a message the codec encodes itself.
type Marshaler interface {
	// MarshalFrames returns the message's protobuf encoding.
	MarshalFrames() mem.BufferSlice
}

// Unmarshaler is a message the codec decodes itself.
type Unmarshaler interface {
	// UnmarshalFrames parses a message from gRPC's receive buffers,
	// which gRPC frees when it returns: a message that keeps parts of
	// them takes references of its own.
	UnmarshalFrames(data mem.BufferSlice) error
}

// codec encodes Marshalers and decodes into Unmarshalers; every other
// message goes to the proto codec.
type codec struct{}

func (codec) Name() string { return Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(Marshaler); ok {
		return m.MarshalFrames(), nil
	}
	return protoCodec().Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(Unmarshaler); ok {
		return m.UnmarshalFrames(data)
	}
	return protoCodec().Unmarshal(data, v)
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(encproto.Name) }

// CallOption makes a client stream use this package's codec.
func CallOption() grpc.CallOption { return grpc.CallContentSubtype(Name) }

// InUse reports whether the client of the server stream whose context is
// ctx chose this package's codec (its content-type ends in "+"+Name);
// otherwise the stream uses the proto codec, and messages must be read
// and written as ordinary protobuf messages.
func InUse(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return InMetadata(md)
}

// InMetadata is InUse for a stream's request metadata.
func InMetadata(md metadata.MD) bool {
	for _, ct := range md.Get("content-type") {
		if strings.HasSuffix(ct, "+"+Name) {
			return true
		}
	}
	return false
}
