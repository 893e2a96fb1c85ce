package framecodec

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// pieces splits b into up to three pieces at cut and halfway after it,
// as gRPC may hand a message over.
func pieces(b []byte, cut uint8) mem.BufferSlice {
	var s mem.BufferSlice
	c1 := int(cut) % (len(b) + 1)
	c2 := c1 + (len(b)-c1)/2
	for _, p := range [][]byte{b[:c1], b[c1:c2], b[c2:]} {
		if len(p) > 0 {
			s = append(s, mem.SliceBuffer(bytes.Clone(p)))
		}
	}
	return s
}

// sameFrame fails t unless f holds what the protobuf library read as w.
func sameFrame(t *testing.T, f *Frame, w *pb.TensorFrame) {
	t.Helper()
	if string(f.JobID) != w.GetJobId() || f.Generation != w.GetGeneration() || f.Op != w.GetOp() || f.Step != w.GetStep() ||
		f.Phase != w.GetPhase() || f.Chunk != w.GetChunk() || f.Offset != w.GetOffset() || f.Total != w.GetTotal() ||
		f.DType != w.GetDtype() || math.Float32bits(f.Scale) != math.Float32bits(w.GetScale()) || f.Rank != w.GetRank() ||
		f.Last != w.GetLast() || !bytes.Equal(f.Scales, w.GetScales()) || f.ScaleChunk != w.GetScaleChunk() ||
		f.Span != w.GetSpan() || f.NBytes != len(w.GetData()) {
		t.Fatalf("decoder disagrees with proto:\n got %+v\nwant %v", f, w)
	}
	if got := f.AppendData([]byte{7}); !bytes.Equal(got[1:], w.GetData()) || got[0] != 7 {
		t.Fatalf("data: got %x, want %x", got[1:], w.GetData())
	}
	if len(w.GetData())%4 != 0 {
		return
	}
	vals := make([]float32, len(w.GetData())/4)
	if err := wire.GetF32(vals, w.GetData()); err != nil {
		t.Fatal(err)
	}
	// The values three ways: copied and added straight from the pieces,
	// and decoded. Each consumes the data, so each works on a copy of f
	// (the pieces are plain slices: references cost nothing).
	got := make([]float32, len(vals))
	f2 := *f
	f2.CombineInto(got, false)
	sum := make([]float32, len(vals))
	for i := range sum {
		sum[i] = float32(i) - 0.5
	}
	f3 := *f
	f3.CombineInto(sum, true)
	f4 := *f
	f4.store = nil
	data := f4.Values()
	if len(data) != len(vals) {
		t.Fatalf("Values: %d values, want %d", len(data), len(vals))
	}
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	for i := range vals {
		if !same(got[i], vals[i]) || !same(data[i], vals[i]) || !same(sum[i], (float32(i)-0.5)+vals[i]) {
			t.Fatalf("value %d: got %v (copied), %v (decoded), sum %v; want %v", i, got[i], data[i], sum[i], vals[i])
		}
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func f32(v ...float32) []byte { return wire.PutF32(make([]byte, 4*len(v)), v) }

// FuzzSyncRequest checks the parameter server's request decoder against
// the protobuf library on arbitrary input split into arbitrary pieces: it
// never panics, and whatever both accept, they read the same way.
func FuzzSyncRequest(f *testing.F) {
	grad := &pb.TensorFrame{JobId: "j", Generation: 3, Op: pb.Op_OP_PUSH_GRADIENT, Step: 7, Chunk: 2, Offset: 8, Total: 11,
		Dtype: pb.DType_D_TYPE_F32, Data: f32(1, -2, 3.5), Rank: 1, Last: true}
	f.Add(marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: grad}}), uint8(3))
	f.Add(marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_State{State: grad}}), uint8(40))
	f.Add(marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: &pb.SyncJoin{JobId: "j", Rank: 2, WorldSize: 3, NumParams: 9}}}), uint8(1))
	f.Add(marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: &pb.TensorFrame{Dtype: pb.DType_D_TYPE_I8,
		Data: []byte{1, 2, 3}, Scales: f32(0.5), ScaleChunk: 3, Scale: -1, Span: 4}}}), uint8(5))
	// Oneof fields in a row: a repeated one merges, another replaces.
	two := append(marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: grad}}),
		marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: &pb.TensorFrame{Step: 9}}})...)
	f.Add(two, uint8(20))
	f.Add(append(bytes.Clone(two), marshal(f, &pb.SyncRequest{Msg: &pb.SyncRequest_State{State: &pb.TensorFrame{Phase: 2}}})...), uint8(0))
	f.Add([]byte{0x12, 0xff, 0xff, 0xff, 0xff, 0x0f}, uint8(2))
	f.Add([]byte{0x12, 0x02, 0x52, 0x05}, uint8(1))
	// As a worker encodes it: the data length padded for alignment.
	o := NewOut()
	o.Encode(nil, FieldGradient, grad, []float32{1, 2, 3})
	f.Add(append(bytes.Clone(o.Header()), o.Data()...), uint8(9))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		var m SyncRequest
		err := m.UnmarshalFrames(pieces(b, cut))
		var want pb.SyncRequest
		perr := proto.Unmarshal(b, &want)
		if err != nil || perr != nil {
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return // both refusing, or one stricter (size limits, UTF-8), is fine
		}
		switch w := want.GetMsg().(type) {
		case nil:
			if m.Msg != 0 {
				t.Fatalf("decoded field %d; proto read none", m.Msg)
			}
		case *pb.SyncRequest_Join:
			if m.Msg != FieldJoin || !proto.Equal(m.Join, w.Join) {
				t.Fatalf("join: got field %d %v, want %v", m.Msg, m.Join, w.Join)
			}
		case *pb.SyncRequest_Gradient:
			if m.Msg != FieldGradient {
				t.Fatalf("got field %d, want a gradient", m.Msg)
			}
			sameFrame(t, &m.Frame, w.Gradient)
		case *pb.SyncRequest_State:
			if m.Msg != FieldState {
				t.Fatalf("got field %d, want a state frame", m.Msg)
			}
			sameFrame(t, &m.Frame, w.State)
		}
		// The proto path reads the same.
		var viaProto SyncRequest
		viaProto.SetProto(&want)
		if viaProto.Msg != m.Msg {
			t.Fatalf("SetProto: field %d, want %d", viaProto.Msg, m.Msg)
		}
		if m.Msg == FieldGradient || m.Msg == FieldState {
			sameFrame(t, &viaProto.Frame, map[protowire.Number]*pb.TensorFrame{FieldGradient: want.GetGradient(), FieldState: want.GetState()}[m.Msg])
		}
	})
}

// FuzzSyncResponse is FuzzSyncRequest for the worker's decoder of the
// parameter server's answers.
func FuzzSyncResponse(f *testing.F) {
	params := &pb.TensorFrame{JobId: "j", Generation: 1, Op: pb.Op_OP_PULL_PARAMETERS, Step: 4, Offset: 2, Total: 5,
		Dtype: pb.DType_D_TYPE_F32, Data: f32(0.25, 1e-30, -7), Last: true}
	f.Add(marshal(f, &pb.SyncResponse{Parameters: params, SendState: true}), uint8(6))
	f.Add(marshal(f, &pb.SyncResponse{Factors: params, Receipt: &pb.PushReceipt{Applied: true, StaleSteps: 3, WaitSeconds: 0.5}}), uint8(30))
	f.Add(marshal(f, &pb.SyncResponse{CheckpointWritten: true}), uint8(0))
	f.Add(marshal(f, &pb.SyncResponse{Parameters: params, Factors: &pb.TensorFrame{Data: []byte{1, 2}}}), uint8(11))
	f.Add([]byte{0x0a, 0x02, 0x52, 0x05}, uint8(1))
	f.Add([]byte{0x2a, 0x03, 0x08, 0x01}, uint8(2))
	o := NewOut()
	prefix, err := AppendSyncResponse(nil, true, false, &pb.PushReceipt{Refused: true, StaleUpdates: 2})
	if err != nil {
		f.Fatal(err)
	}
	o.Encode(prefix, FieldParameters, params, []float32{1, 2, 3, 4})
	f.Add(append(bytes.Clone(o.Header()), o.Data()...), uint8(17))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		var m SyncResponse
		err := m.UnmarshalFrames(pieces(b, cut))
		var want pb.SyncResponse
		perr := proto.Unmarshal(b, &want)
		if err != nil || perr != nil {
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if m.HasParameters != (want.Parameters != nil) || m.HasFactors != (want.Factors != nil) ||
			m.SendState != want.SendState || m.CheckpointWritten != want.CheckpointWritten ||
			(m.Receipt == nil) != (want.Receipt == nil) || m.Receipt != nil && !proto.Equal(m.Receipt, want.Receipt) {
			t.Fatalf("decoder disagrees with proto:\n got params %v factors %v send_state %v written %v receipt %v\nwant %v",
				m.HasParameters, m.HasFactors, m.SendState, m.CheckpointWritten, m.Receipt, &want)
		}
		sameFrame(t, &m.Parameters, want.Parameters)
		sameFrame(t, &m.Factors, want.Factors)
		var viaProto SyncResponse
		viaProto.SetProto(&want)
		sameFrame(t, &viaProto.Parameters, want.Parameters)
		sameFrame(t, &viaProto.Factors, want.Factors)
	})
}

// TestOutEncodesProtobuf checks that messages encoded by Out are what
// the protobuf library reads (padded lengths and prefixes included), that
// their values start 4-byte aligned after gRPC's message prefix, and that
// the decoders read them back.
func TestOutEncodesProtobuf(t *testing.T) {
	for _, n := range []int{0, 1, 3, 31, 32, 33, 4099, 1 << 18} {
		for _, job := range []string{"j", "job-12", "a-much-longer-job-name"} {
			for _, withPrefix := range []bool{false, true} {
				data := make([]float32, n)
				for i := range data {
					data[i] = float32(i) - 0.25
				}
				tf := &pb.TensorFrame{JobId: job, Generation: 3, Op: pb.Op_OP_PULL_PARAMETERS, Step: 1 << 40, Phase: 1, Chunk: 2,
					Offset: 77, Total: uint64(n) + 77, Dtype: pb.DType_D_TYPE_F32, Rank: -1, Last: true}
				var prefix []byte
				var rc *pb.PushReceipt
				if withPrefix {
					rc = &pb.PushReceipt{Applied: true, StaleSteps: 2, WaitSeconds: 1.5}
					var err error
					if prefix, err = AppendSyncResponse(nil, true, true, rc); err != nil {
						t.Fatal(err)
					}
				}
				o := NewOut()
				o.Encode(prefix, FieldParameters, tf, data)
				if n > 0 && (GRPCPrefix+len(o.Header()))%4 != 0 {
					t.Errorf("n=%d job %q: values start at %d after the gRPC prefix, not 4-aligned", n, job, len(o.Header()))
				}
				b := append(bytes.Clone(o.Header()), o.Data()...)
				var resp pb.SyncResponse
				if err := proto.Unmarshal(b, &resp); err != nil {
					t.Fatalf("n=%d job %q: proto: %v", n, job, err)
				}
				if resp.SendState != withPrefix || resp.CheckpointWritten != withPrefix || !proto.Equal(resp.Receipt, rc) {
					t.Fatalf("n=%d: proto read send_state %v written %v receipt %v", n, resp.SendState, resp.CheckpointWritten, resp.Receipt)
				}
				w := resp.GetParameters()
				want := proto.Clone(tf).(*pb.TensorFrame)
				want.Data = f32(data...)
				if !proto.Equal(w, want) {
					t.Fatalf("n=%d job %q: proto read %v", n, job, w)
				}
				var m SyncResponse
				if err := m.UnmarshalFrames(pieces(b, uint8(n))); err != nil {
					t.Fatal(err)
				}
				sameFrame(t, &m.Parameters, want)

				// The same frame as a worker's gradient.
				o.Encode(nil, FieldGradient, tf, data)
				b = append(bytes.Clone(o.Header()), o.Data()...)
				var req pb.SyncRequest
				if err := proto.Unmarshal(b, &req); err != nil || !proto.Equal(req.GetGradient(), want) {
					t.Fatalf("n=%d: gradient: proto read %v (%v)", n, req.GetGradient(), err)
				}
			}
		}
	}
}

// TestMarshalReleases: Released fires once gRPC frees the values'
// buffer, at once for values too small to be reference counted.
func TestMarshalReleases(t *testing.T) {
	for _, n := range []int{0, 3, 1 << 12} {
		o := NewOut()
		vals := make([]float32, n)
		o.Encode(nil, FieldGradient, &pb.TensorFrame{JobId: "j"}, vals)
		s := o.MarshalFrames()
		if s.Len() != len(o.Header())+4*n {
			t.Fatalf("n=%d: %d bytes marshalled, want %d", n, s.Len(), len(o.Header())+4*n)
		}
		big := n >= 1<<12
		select {
		case <-o.Released():
			if big {
				t.Fatalf("n=%d: released before gRPC freed the buffer", n)
			}
		default:
			if !big {
				t.Fatalf("n=%d: not released at once", n)
			}
		}
		s.Free()
		if big {
			select {
			case <-o.Released():
			default:
				t.Fatalf("n=%d: not released once freed", n)
			}
		}
	}
}

// stubStream is a Stream that marshals as gRPC would and frees the
// buffers later (or never).
type stubStream struct {
	free func(mem.BufferSlice)
	err  error
}

func (s *stubStream) SendMsg(m any) error {
	if s.err != nil {
		return s.err
	}
	b, err := codec{}.Marshal(m)
	if err != nil {
		return err
	}
	s.free(b)
	return nil
}

// TestSenderWaits: Send returns only once the values are released, and
// gives up (after the grace period) when the context ends first.
func TestSenderWaits(t *testing.T) {
	var s Sender
	vals := make([]float32, 1<<12)
	st := &stubStream{free: func(b mem.BufferSlice) { b.Free() }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if err := s.Send(ctx, st, nil, FieldGradient, &pb.TensorFrame{}, vals); err != nil {
			t.Fatal(err)
		}
	}
	if s.spare == nil {
		t.Fatal("the Out was not kept for reuse")
	}
	// gRPC holds on to the values: Send returns with ctx's error, and the
	// Out is not reused.
	var held mem.BufferSlice
	st.free = func(b mem.BufferSlice) { held = b }
	short, cancel2 := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel2()
	start := time.Now()
	err := s.Send(short, st, nil, FieldGradient, &pb.TensorFrame{}, vals)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < ReleaseGrace {
		t.Fatalf("held values: %v after %v; want DeadlineExceeded after the grace period", err, time.Since(start))
	}
	if s.spare != nil {
		t.Fatal("an Out gRPC still holds was kept for reuse")
	}
	held.Free()
	// A failed SendMsg is returned.
	st.err = errors.New("stream broke")
	if err := s.Send(ctx, st, nil, FieldGradient, &pb.TensorFrame{}, vals[:1]); !errors.Is(err, st.err) {
		t.Fatalf("failed SendMsg: %v", err)
	}
}
