package federation

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// session is one client's Participate stream.
type session struct {
	client int
	out    chan message // to the stream's sender; never closed
	stop   context.CancelFunc
}

// message is one message for a client, followed by a model when model is
// set (frames tagged with tag's op, step and phase).
type message struct {
	resp  *pb.ParticipateResponse
	model []float32
	tag   *pb.TensorFrame
}

// sendLocked queues m for the client, dropping the session when its
// outbox is full (it then misses its rounds). Called under Driver.mu.
func (c *session) sendLocked(m message) {
	select {
	case c.out <- m:
	default:
		c.stop()
	}
}

// Serve serves one real federated client's Participate stream (see
// federation.proto): it reads the join and hands the stream to the driver
// of the job it names, which lookup returns (or the error, with its gRPC
// code, that ends the stream: NotFound, FailedPrecondition).
func Serve(stream pb.Federation_ParticipateServer, lookup func(jobID string) (*Driver, error)) error {
	_, join, err := rpc.First(stream.Recv, (*pb.ParticipateRequest).GetJoin, "Participate", "join")
	if err != nil {
		return err
	}
	if err := rpc.CheckLen("join.job_id", join.JobId, 1, 128); err != nil {
		return err
	}
	d, err := lookup(join.JobId)
	if err != nil {
		return err
	}
	return d.serve(stream, join)
}

// serve runs the stream of a client that joined: its sender here, its
// receive loop beside it.
func (d *Driver) serve(stream pb.Federation_ParticipateServer, join *pb.FederationJoin) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	switch {
	case join.Generation != d.gen:
		return status.Errorf(codes.Aborted, "generation %d is stale; the job is at generation %d", join.Generation, d.gen)
	case join.NumClients != int32(d.n):
		return status.Errorf(codes.InvalidArgument, "num_clients %d, the job has %d", join.NumClients, d.n)
	case join.Client < 0 || int(join.Client) >= d.n:
		return status.Errorf(codes.InvalidArgument, "client %d out of range [0, %d)", join.Client, d.n)
	case !d.entry && len(join.Layout) > 0:
		return status.Errorf(codes.InvalidArgument, "client %d: a layout, but the job's model is the spec's (%s): layouts are for entrypoint jobs' scripts", join.Client, d.spec.GetModel())
	case d.entry && len(join.Layout) == 0:
		return status.Errorf(codes.InvalidArgument, "client %d: no layout; an entrypoint job's client joins with its parameters' layout and initial values", join.Client)
	case !d.entry && join.NumParams != int64(d.params):
		return status.Errorf(codes.InvalidArgument, "model has %d parameters, the server's has %d", join.NumParams, d.params)
	}
	hist, err := checkHistogram(join.LabelHistogram, join.NumExamples, d.classes)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "join of client %d: %v", join.Client, err)
	}
	var initial []float32
	var n int
	if d.entry {
		if n, err = layoutSize(join.Layout); err != nil {
			return status.Errorf(codes.InvalidArgument, "join of client %d: layout: %v", join.Client, err)
		}
		if join.NumParams != int64(n) {
			return status.Errorf(codes.InvalidArgument, "join of client %d: num_params %d, its layout holds %d", join.Client, join.NumParams, n)
		}
		if initial, err = d.readInitial(stream, join.Client, n); err != nil {
			return err
		}
	}
	c := &session{client: int(join.Client), out: make(chan message, fedOutbox), stop: cancel}
	d.mu.Lock()
	if !d.activeLocked() {
		d.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "job %s has ended", d.jobID)
	}
	if d.entry {
		err = d.entryJoinLocked(c.client, join.Layout, n, initial)
	}
	if err == nil {
		err = d.joinLocked(c, hist)
	}
	if err == nil {
		d.receivers.Add(1) // under mu, not stopped: before Run's Wait
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		d.mu.Lock()
		d.leaveLocked(c)
		d.mu.Unlock()
	}()

	// The receive loop runs beside the handler (as Connect's), so that the
	// handler can end the stream while Recv blocks; Run waits for it.
	recvErr := make(chan error, 1)
	go func() {
		defer d.receivers.Done()
		err := d.receive(c, stream)
		recvErr <- err
		cancel()
	}()
	var sp wire.Splitter
	for {
		select {
		case m := <-c.out:
			if err := d.send(stream, &sp, m); err != nil {
				return err
			}
		case <-d.done:
			// The driver ended the job SUCCEEDED: say so. Any other
			// message queued is moot now.
			d.mu.Lock()
			msg := d.doneMsg
			d.mu.Unlock()
			if msg != "" {
				return stream.Send(&pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Done{Done: &pb.FederationDone{Message: msg}}})
			}
			return status.Errorf(codes.FailedPrecondition, "job %s has ended", d.jobID)
		case <-ctx.Done():
			select {
			case err := <-recvErr:
				if errors.Is(err, io.EOF) {
					return nil // the client left
				}
				return err
			default:
			}
			if err := stream.Context().Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Errorf(codes.ResourceExhausted, "client %d is not reading its stream: dropped", c.client)
		}
	}
}

// send writes one message and the model that follows it.
func (d *Driver) send(stream pb.Federation_ParticipateServer, sp *wire.Splitter, m message) error {
	if err := stream.Send(m.resp); err != nil {
		return err
	}
	if m.model == nil {
		return nil
	}
	return sp.Frames(m.tag, m.model, func(f *pb.TensorFrame) error {
		return stream.Send(&pb.ParticipateResponse{Msg: &pb.ParticipateResponse_Model{Model: f}})
	})
}

// assembly is what a client's receive loop assembles: an update's header
// and its delta so far.
type assembly struct {
	hdr   *pb.ClientUpdate
	delta []float32
	asm   wire.Assembler
}

// receive reads a client's messages until the stream ends or a message is
// refused (the error, with its code, ends the stream).
func (d *Driver) receive(c *session, stream pb.Federation_ParticipateServer) error {
	var r assembly
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch m := m.Msg.(type) {
		case *pb.ParticipateRequest_Update:
			if r.hdr != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: a new update header before the delta of round %d ended", c.client, r.hdr.Round)
			}
			if m.Update.Round < 1 {
				return status.Errorf(codes.InvalidArgument, "client %d: update for round %d; rounds are numbered from 1", c.client, m.Update.Round)
			}
			if err := checkMetrics(m.Update.Metrics); err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: update for round %d: %v", c.client, m.Update.Round, err)
			}
			d.mu.Lock()
			params := d.params // set before this client joined
			d.mu.Unlock()
			r = assembly{hdr: m.Update, delta: make([]float32, params)}
			r.asm.Start(wire.Expect{JobID: d.jobID, Generation: d.gen, Op: pb.Op_OP_PUSH_GRADIENT,
				Step: int64(r.hdr.Round), Total: uint64(params)}, 0)
		case *pb.ParticipateRequest_Delta:
			if r.hdr == nil {
				return status.Errorf(codes.InvalidArgument, "client %d: delta frame without an update header", c.client)
			}
			if err := r.asm.Copy(r.delta, m.Delta); err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: delta: %v", c.client, err)
			}
			if !r.asm.Done() {
				continue
			}
			hdr := r.hdr
			hist, err := checkHistogram(hdr.LabelHistogram, hdr.NumExamples, d.classes)
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "client %d: update for round %d: %v", c.client, hdr.Round, err)
			}
			u := federated.Update{Client: c.client, Round: int(hdr.Round), Delta: r.delta, NumExamples: int(hdr.NumExamples),
				LabelHist: hist, TrainLoss: hdr.TrainLoss}
			r = assembly{}
			d.mu.Lock()
			err = d.updateLocked(c, u)
			if err == nil {
				d.metricsLocked(c.client, u.Round, "fit", hdr.Metrics)
			}
			d.mu.Unlock()
			if err != nil {
				return err
			}
		case *pb.ParticipateRequest_Eval:
			d.mu.Lock()
			err := error(status.Errorf(codes.FailedPrecondition, "job %s has ended", d.jobID))
			if d.activeLocked() {
				err = d.evalLocked(c, m.Eval)
			}
			d.mu.Unlock()
			if err != nil {
				return err
			}
		case *pb.ParticipateRequest_Leave:
			d.mu.Lock()
			d.leftLocked(c, m.Leave.Reason)
			d.mu.Unlock()
		default:
			return status.Errorf(codes.InvalidArgument, "client %d: unexpected message %T after the join", c.client, m)
		}
	}
}

// checkHistogram converts a label histogram from the network: classes
// counts (or none), each ≥ 0, summing to n.
func checkHistogram(h []int64, n int64, classes int) ([]int, error) {
	if n < 0 || n > 1<<31 {
		return nil, fmt.Errorf("num_examples %d out of range [0, 2^31]", n)
	}
	if len(h) == 0 {
		return nil, nil
	}
	if len(h) != classes || classes > maxLabelClasses {
		return nil, fmt.Errorf("label histogram has %d classes, the model %d", len(h), classes)
	}
	out := make([]int, len(h))
	var sum int64
	for i, v := range h {
		if v < 0 || v > n {
			return nil, fmt.Errorf("label histogram count %d for class %d out of range [0, %d]", v, i, n)
		}
		out[i] = int(v)
		sum += v
	}
	if sum != n {
		return nil, fmt.Errorf("label histogram sums to %d, num_examples is %d", sum, n)
	}
	return out, nil
}
