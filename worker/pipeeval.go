package worker

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gradsync/gradsync/aggregator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// evaluate implements synchronizer: the test split runs through the
// stages of replica 0 (stage.Executor.Infer), every one of its ranks
// running the objective's evaluation over a pipeForward, so that they all
// walk the same test batches; the last stage's figures are the job's,
// and reach every rank over the job's ring (rank 0 reports them). The
// other replicas only take part in that broadcast.
func (p *pipeTask) evaluate(ctx context.Context, rank int32, _ forwarder, res *pb.JobResult, run func(forwarder, *pb.JobResult) error) (bool, error) {
	last := p.coord.RankOf(0, p.coord.Stages-1)
	var payload []byte
	if p.coord.Replica == 0 {
		f := &pipeForward{ctx: ctx, p: p, classes: p.net.Options().Classes}
		into := &pb.JobResult{}
		err := run(f, into)
		if f.err != nil {
			err = f.err // the pipeline's failure, not what followed from it
		}
		if err != nil {
			return false, fmt.Errorf("evaluating through the pipeline: %w", err)
		}
		if p.coord.Rank == last {
			if payload, err = proto.Marshal(into); err != nil {
				return false, err
			}
		}
	}
	got, err := p.broadcastBytes(ctx, payload, last)
	if err != nil {
		return false, fmt.Errorf("sharing the evaluation's figures: %w", err)
	}
	if rank != 0 {
		return false, nil
	}
	figures := &pb.JobResult{}
	if err := proto.Unmarshal(got, figures); err != nil {
		return false, fmt.Errorf("pipeline: the last stage's evaluation figures: %w", err)
	}
	// Every field the evaluation set replaces res's (a merge would append
	// to the repeated ones, such as the per-class accuracies).
	dst := res.ProtoReflect()
	figures.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	return true, nil
}

// broadcastBytes sends root's b to every rank over the job's ring, two
// bytes to a float32 (integers below 2¹⁶ are exact in float32), after
// its length; it returns root's bytes on every rank.
func (p *pipeTask) broadcastBytes(ctx context.Context, b []byte, root int) ([]byte, error) {
	n := make([]float32, 2)
	if p.coord.Rank == root {
		n[0], n[1] = float32(len(b)&0xffff), float32(len(b)>>16)
	}
	if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
		return aggregator.Broadcast(ctx, p.world, n, root, seq, p.opt)
	}); err != nil {
		return nil, err
	}
	size := int(n[0]) | int(n[1])<<16
	buf := make([]float32, (size+1)/2)
	if p.coord.Rank == root {
		for i := range buf {
			v := uint16(b[2*i])
			if 2*i+1 < len(b) {
				v |= uint16(b[2*i+1]) << 8
			}
			buf[i] = float32(v)
		}
	}
	if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
		return aggregator.Broadcast(ctx, p.world, buf, root, seq, p.opt)
	}); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	for i, v := range buf {
		u := uint16(v)
		out[2*i] = byte(u)
		if 2*i+1 < size {
			out[2*i+1] = byte(u >> 8)
		}
	}
	return out, nil
}

// pipeForward is the forwarder an evaluation runs over on a pipeline
// stage: each Forward is one Infer pass of the batch through the stages
// (the first stage reads x, the others receive their input). On the last
// stage it returns the batch's logits; on the others zeros of the same
// shape, whose figures are thrown away. A failed pass is kept in err and
// makes the following passes return at once (the executor is unusable).
type pipeForward struct {
	ctx     context.Context
	p       *pipeTask
	classes int
	logits  []float32
	err     error
}

func (f *pipeForward) InputSize() int { return f.p.net.InputSize() }

func (f *pipeForward) Forward(x []float32, batch int, _ bool) []float32 {
	if cap(f.logits) < batch*f.classes {
		f.logits = make([]float32, batch*f.classes)
	}
	out := f.logits[:batch*f.classes]
	clear(out)
	if f.err != nil {
		return out
	}
	p := f.p
	var in []float32
	if p.coord.Stage == 0 {
		in = x
	}
	var sink func(lo int, logits []float32)
	if p.coord.Stage == p.coord.Stages-1 {
		sink = func(lo int, logits []float32) { copy(out[lo*f.classes:], logits) }
	}
	ctx, cancel := context.WithTimeout(f.ctx, p.timeout)
	defer cancel()
	f.err = p.exec.Infer(ctx, p.pass, batch, in, sink)
	p.pass++
	return out
}
