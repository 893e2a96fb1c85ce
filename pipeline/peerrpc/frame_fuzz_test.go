package peerrpc

import (
	"encoding/binary"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/pipeline/stage"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// fuzzWant is the tensor the fuzzed receiver expects: micro-batch 1 of
// step 5's activation, 2×3 values, on a link of job "j", generation 4,
// from stage 0.
var fuzzWant = stage.Header{Step: 5, MicroBatch: 1, Dir: stage.Activation, Shape: [2]int{2, 3}}

func fuzzLink() *Link {
	return &Link{job: "j", gen: 4, self: 1, peer: 0, recvDir: pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION}
}

// FuzzFrames decodes arbitrary bytes as a sequence of ExchangeRequests
// (each prefixed by a 2-byte length) and feeds them to a receiver as
// Recv does: link tags (checkTags), then take. It never panics, refuses
// only with *stage.HeaderError, and accepts only frames that continue the
// tensor in order, without gaps or overlaps, to its exact end.
func FuzzFrames(f *testing.F) {
	msg := func(fr *pb.PipelineFrame) []byte {
		b, err := proto.Marshal(&pb.ExchangeRequest{Frame: fr})
		if err != nil {
			f.Fatal(err)
		}
		return binary.LittleEndian.AppendUint16(nil, uint16(len(b))) // the caller appends b
	}
	seq := func(frs ...*pb.PipelineFrame) []byte {
		var out []byte
		for _, fr := range frs {
			b, _ := proto.Marshal(&pb.ExchangeRequest{Frame: fr})
			out = append(append(out, msg(fr)...), b...)
		}
		return out
	}
	good := func(off int, vals []float32, last bool) *pb.PipelineFrame {
		return &pb.PipelineFrame{JobId: "j", Generation: 4, Stage: 0, Direction: pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION,
			Step: 5, MicroBatch: 1, Shape: []uint64{2, 3}, Offset: uint64(off), Last: last, Data: wire.PutF32(make([]byte, 4*len(vals)), vals)}
	}
	f.Add(seq(good(0, []float32{1, 2, 3, 4, 5, 6}, true)))
	f.Add(seq(good(0, []float32{1, 2}, false), good(2, []float32{3, 4, 5, 6}, true)))
	f.Add(seq(good(0, []float32{1, 2}, false), good(1, []float32{3, 4, 5, 6}, true)))
	bad := good(0, []float32{1}, true)
	bad.Shape = []uint64{1 << 40, 3}
	f.Add(seq(bad))
	f.Add([]byte{5, 0, 0x0a, 0x03, 0x0a, 0x01, 'j'})
	f.Fuzz(func(t *testing.T, b []byte) {
		l := fuzzLink()
		dst := make([]float32, fuzzWant.Len())
		got := 0
		for len(b) >= 2 {
			n := int(binary.LittleEndian.Uint16(b))
			b = b[2:]
			if n > len(b) {
				return
			}
			var req pb.ExchangeRequest
			if err := proto.Unmarshal(b[:n], &req); err != nil {
				return
			}
			b = b[n:]
			fr := req.GetFrame()
			err := l.checkTags(fr)
			if err == nil && fr.GetAbort() != "" {
				return // an abort ends the link
			}
			next, last := got, false
			if err == nil {
				next, last, err = take(fr, fuzzWant, dst, got)
			}
			if err != nil {
				var he *stage.HeaderError
				if !errors.As(err, &he) {
					t.Fatalf("refusal %v is not a *stage.HeaderError", err)
				}
				return // a refusal breaks the link
			}
			if fr.GetOffset() != uint64(got) || next != got+len(fr.GetData())/4 || next > fuzzWant.Len() || last && next != fuzzWant.Len() {
				t.Fatalf("accepted frame at %d with %d bytes (last %v) after %d values", fr.GetOffset(), len(fr.GetData()), last, got)
			}
			if got = next; last {
				return // Recv returns: the next frame belongs to the next tensor
			}
		}
	})
}
