package framecodec

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Field numbers of the parameter server's messages (ps.proto).
const (
	// SyncRequest's oneof msg.
	FieldJoin     protowire.Number = 1
	FieldGradient protowire.Number = 2
	FieldState    protowire.Number = 3
	// SyncResponse.
	FieldParameters        protowire.Number = 1
	FieldFactors           protowire.Number = 2
	FieldSendState         protowire.Number = 3
	FieldCheckpointWritten protowire.Number = 4
	FieldReceipt           protowire.Number = 5
)

// maxSmallMessage bounds the join and receipt messages inside a
// SyncRequest or SyncResponse (a join carries a job spec).
const maxSmallMessage = 1 << 20

// SyncRequest is a pb.SyncRequest as a parameter server reads it: Msg
// says which of the oneof's fields it holds (FieldJoin, FieldGradient,
// FieldState; 0 for none), Join the join, Frame the gradient or state
// frame, whose data stays in gRPC's buffers until it is consumed or
// released. It is reused from message to message.
type SyncRequest struct {
	Msg   protowire.Number
	Join  *pb.SyncJoin
	Frame Frame

	join []byte // the join's encoding, parsed at the end
}

// Release drops the frame's reference to gRPC's buffers.
func (m *SyncRequest) Release() { m.Frame.Release() }

func (m *SyncRequest) reset() {
	m.Frame.Release()
	m.Frame.Reset()
	m.Msg, m.Join, m.join = 0, nil, m.join[:0]
}

// SetProto fills m from a message the proto codec decoded (see
// Frame.SetProto).
func (m *SyncRequest) SetProto(r *pb.SyncRequest) {
	m.reset()
	switch v := r.GetMsg().(type) {
	case *pb.SyncRequest_Join:
		m.Msg, m.Join = FieldJoin, v.Join
	case *pb.SyncRequest_Gradient:
		m.Msg = FieldGradient
		m.Frame.SetProto(v.Gradient)
	case *pb.SyncRequest_State:
		m.Msg = FieldState
		m.Frame.SetProto(v.State)
	}
}

// UnmarshalFrames implements Unmarshaler. As protobuf does, the last of
// the oneof's fields wins, and a field that occurs again in a row merges
// into the first.
func (m *SyncRequest) UnmarshalFrames(s mem.BufferSlice) error {
	m.reset()
	c := NewCursor(s)
	for c.n > 0 && c.err == nil {
		num, typ := c.tag()
		if typ != protowire.BytesType || num < FieldJoin || num > FieldState {
			c.skip(typ)
			continue
		}
		if num != m.Msg {
			m.Frame.Reset()
			m.join = m.join[:0]
			m.Msg = num
		}
		if num == FieldJoin {
			l, ok := c.length(0, maxSmallMessage)
			if ok {
				m.join = c.appendN(m.join, l)
			}
			continue
		}
		l, ok := c.length(0, uint64(c.n))
		if ok {
			m.Frame.decode(&c, c.n-l)
		}
	}
	if c.err == nil && m.Msg == FieldJoin {
		m.Join = &pb.SyncJoin{}
		if err := proto.Unmarshal(m.join, m.Join); err != nil {
			c.fail(fmt.Errorf("%w: join: %v", ErrMalformed, err))
		}
	}
	if c.err != nil {
		m.Frame.raw = nil // no reference taken
		m.Msg, m.Join = 0, nil
		return fmt.Errorf("%w: SyncRequest: %v", ErrMalformed, c.err)
	}
	if m.Msg != FieldJoin {
		m.Frame.ref()
	}
	return nil
}

// SyncResponse is a pb.SyncResponse as a worker reads it: the parameter
// and factor frames (Has* say which were present) with their data still
// in gRPC's buffers until consumed or released, and the other fields. It
// is reused from message to message.
type SyncResponse struct {
	Parameters, Factors       Frame
	HasParameters, HasFactors bool
	SendState                 bool
	CheckpointWritten         bool
	Receipt                   *pb.PushReceipt

	receipt []byte
}

// Release drops the frames' references to gRPC's buffers.
func (m *SyncResponse) Release() {
	m.Parameters.Release()
	m.Factors.Release()
}

func (m *SyncResponse) reset() {
	m.Release()
	m.Parameters.Reset()
	m.Factors.Reset()
	m.HasParameters, m.HasFactors, m.SendState, m.CheckpointWritten = false, false, false, false
	m.Receipt, m.receipt = nil, m.receipt[:0]
}

// SetProto fills m from a message the proto codec decoded (see
// Frame.SetProto).
func (m *SyncResponse) SetProto(r *pb.SyncResponse) {
	m.reset()
	if r.Parameters != nil {
		m.HasParameters = true
		m.Parameters.SetProto(r.Parameters)
	}
	if r.Factors != nil {
		m.HasFactors = true
		m.Factors.SetProto(r.Factors)
	}
	m.SendState, m.CheckpointWritten, m.Receipt = r.SendState, r.CheckpointWritten, r.Receipt
}

// UnmarshalFrames implements Unmarshaler.
func (m *SyncResponse) UnmarshalFrames(s mem.BufferSlice) error {
	m.reset()
	c := NewCursor(s)
	for c.n > 0 && c.err == nil {
		num, typ := c.tag()
		switch {
		case typ == protowire.VarintType && num == FieldSendState:
			m.SendState = c.varint() != 0
		case typ == protowire.VarintType && num == FieldCheckpointWritten:
			m.CheckpointWritten = c.varint() != 0
		case typ == protowire.BytesType && num == FieldReceipt:
			l, ok := c.length(0, maxSmallMessage)
			if ok {
				m.receipt = c.appendN(m.receipt, l)
			}
			if m.Receipt == nil {
				m.Receipt = &pb.PushReceipt{}
			}
		case typ == protowire.BytesType && (num == FieldParameters || num == FieldFactors):
			f := &m.Parameters
			m.HasParameters = m.HasParameters || num == FieldParameters
			if num == FieldFactors {
				f, m.HasFactors = &m.Factors, true
			}
			l, ok := c.length(0, uint64(c.n))
			if ok {
				f.decode(&c, c.n-l)
			}
		default:
			c.skip(typ)
		}
	}
	if c.err == nil && m.Receipt != nil {
		if err := proto.Unmarshal(m.receipt, m.Receipt); err != nil {
			c.fail(fmt.Errorf("%w: receipt: %v", ErrMalformed, err))
		}
	}
	if c.err != nil {
		m.Parameters.raw, m.Factors.raw = nil, nil // no references taken
		return fmt.Errorf("%w: SyncResponse: %v", ErrMalformed, c.err)
	}
	m.Parameters.ref()
	m.Factors.ref()
	return nil
}

// AppendSyncResponse appends to b the encoding of a SyncResponse's
// fields other than its frames: the prefix of a parameter or factor
// frame sent with Out (Out.Encode, Sender.Send).
func AppendSyncResponse(b []byte, sendState, checkpointWritten bool, receipt *pb.PushReceipt) ([]byte, error) {
	if sendState {
		b = appendVarintField(b, FieldSendState, 1)
	}
	if checkpointWritten {
		b = appendVarintField(b, FieldCheckpointWritten, 1)
	}
	if receipt != nil {
		rb, err := proto.Marshal(receipt)
		if err != nil {
			return b, err
		}
		b = protowire.AppendTag(b, FieldReceipt, protowire.BytesType)
		b = protowire.AppendBytes(b, rb)
	}
	return b, nil
}
