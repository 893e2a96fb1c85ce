package rpc

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gradsync/gradsync/internal/wire/framecodec"
)

// RefuseUnknown returns interceptors that refuse a request carrying fields
// this server does not know, with InvalidArgument naming the field and
// the message: job files with unknown keys are refused, and the wire
// must not be more lenient — a client newer than the server would
// otherwise have its options dropped without a word. Protobuf-go also
// keeps a known field that arrives with the wrong wire type among the
// unknown fields (SubmitJobRequest `08 01`: spec as a varint), so those
// are refused the same way.
//
// Only messages decoded by the proto codec are checked. Messages that
// framecodec decodes itself (framecodec.Unmarshaler: the ring's and the
// parameter server's frames) are parsed straight from gRPC's buffers and
// never pass through protobuf-go; they are left alone so the hot path
// stays as fast as it is.
func RefuseUnknown() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := CheckUnknown(req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, knownOnly{ss})
	}
	return unary, stream
}

// knownOnly is a server stream whose received messages are checked by
// CheckUnknown.
type knownOnly struct{ grpc.ServerStream }

func (s knownOnly) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return CheckUnknown(m)
}

// CheckUnknown returns InvalidArgument when m, a decoded proto message,
// or any message inside it has unknown fields (or fields with the wrong
// wire type); nil for anything else, including messages framecodec
// decodes itself.
func CheckUnknown(m any) error {
	if _, ok := m.(framecodec.Unmarshaler); ok {
		return nil
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	r := pm.ProtoReflect()
	if !r.IsValid() {
		return nil
	}
	if msg := unknownIn(r, ""); msg != "" {
		return status.Error(codes.InvalidArgument, msg)
	}
	return nil
}

// unknownIn describes the first unknown field found in m (at path, a
// dotted field path from the request; "" for the request itself), or
// returns "".
func unknownIn(m protoreflect.Message, path string) string {
	if raw := m.GetUnknown(); len(raw) > 0 {
		return describeUnknown(m.Descriptor(), raw, path)
	}
	var msg string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		p := join(path, string(fd.Name()))
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				msg = unknownIn(mv.Message(), p+"["+k.String()+"]")
				return msg == ""
			})
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if msg = unknownIn(l.Get(i).Message(), p+"["+strconv.Itoa(i)+"]"); msg != "" {
					break
				}
			}
		default:
			msg = unknownIn(v.Message(), p)
		}
		return msg == ""
	})
	return msg
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// describeUnknown names the first field of raw (m's unknown bytes): a
// number m does not have, or one it has with another wire type.
func describeUnknown(md protoreflect.MessageDescriptor, raw []byte, path string) string {
	where := string(md.FullName())
	if path != "" {
		where += " (" + path + ")"
	}
	num, typ, n := protowire.ConsumeTag(raw)
	if n < 0 {
		return fmt.Sprintf("malformed unknown field in %s", where)
	}
	if fd := md.Fields().ByNumber(num); fd != nil {
		return fmt.Sprintf("field %d (%s) in %s has wire type %s, but a %s field is encoded as %s: "+
			"the client's message does not match this server's definition",
			num, fd.Name(), where, wireTypeName(typ), kindName(fd), wireTypeName(wantWireType(fd)))
	}
	return fmt.Sprintf("unknown field %d in %s: this server does not know it, "+
		"and a client newer than the server must not have its options dropped silently", num, where)
}

func kindName(fd protoreflect.FieldDescriptor) string {
	if fd.IsList() {
		return "repeated " + fd.Kind().String()
	}
	return fd.Kind().String()
}

// wantWireType is the wire type fd is encoded with (packed for repeated
// scalars, which protobuf-go also accepts unpacked).
func wantWireType(fd protoreflect.FieldDescriptor) protowire.Type {
	if fd.IsList() && fd.IsPacked() {
		return protowire.BytesType
	}
	switch fd.Kind() {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind,
		protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.BytesType // string, bytes, message
}

func wireTypeName(t protowire.Type) string {
	switch t {
	case protowire.VarintType:
		return "varint"
	case protowire.Fixed32Type:
		return "fixed32"
	case protowire.Fixed64Type:
		return "fixed64"
	case protowire.BytesType:
		return "length-delimited"
	case protowire.StartGroupType, protowire.EndGroupType:
		return "group"
	}
	return "invalid (" + strconv.Itoa(int(t)) + ")"
}
