package stage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
)

// Config sets up one stage's Executor.
type Config struct {
	// Net is the whole network, or one that holds Stages[Stage] alone
	// (models.NewStage); the executor runs only the layers of
	// Stages[Stage] and touches only that stage's part of its gradient
	// buffer. Stages is Net's partition (models.Partition).
	Net    *models.Network
	Stages []models.Stage
	Stage  int
	// Plan is the schedule for len(Stages) stages; the executor runs
	// Plan.Actions[Stage].
	Plan pipeline.Plan
	// Batch is the samples of one step, Plan.MicroBatches equal
	// micro-batches of Batch/MicroBatches samples each.
	Batch int
	// Prev and Next are the links to stages Stage−1 and Stage+1; nil
	// exactly where there is no such stage.
	Prev, Next Link
	// Cost, when set, makes every Forward and Backward take at least that
	// long (the executor waits out the rest after computing), so that a
	// schedule's bubble can be measured without the machine's cores
	// distorting it.
	Cost Cost
	// Now is the clock of Stats (nil: time.Now).
	Now func() time.Time
}

// Cost is a synthetic duration for each micro-batch's Forward and
// Backward (the loss counts in the last stage's Forward).
type Cost struct{ Forward, Backward time.Duration }

// Stats is what one Step did on its stage.
type Stats struct {
	// Loss is the mean loss over the step's batch (last stage only).
	Loss float32
	// Busy is the time spent in Forward and Backward (loss included);
	// Wall the whole step. Idle is Wall − Busy.
	Busy, Wall time.Duration
	// PeakInFlight is the most micro-batches whose activations the stage
	// held at once (from receiving or starting a Forward to sending the
	// input gradient or ending the Backward).
	PeakInFlight int
	// The bytes of tensor data sent to and received from each neighbour
	// (4 per value): activations go to the next stage and come from the
	// previous one, gradients the other way.
	BytesToPrev, BytesToNext, BytesFromPrev, BytesFromNext int64
}

// Input is what a step needs beyond the links.
type Input struct {
	// X is the step's batch, Batch × Net.InputSize() values (first stage
	// only; other stages receive their input).
	X []float32
	// Loss computes, on the last stage only, micro-batch mb's mean loss
	// from its logits (samples × classes) and writes the loss's gradient
	// with respect to the logits into dlogits, as
	// models.SoftmaxCrossEntropy does for the micro-batch's labels.
	Loss func(mb int, logits, dlogits []float32) float32
}

// slot holds one micro-batch in flight: a twin of the network (its own
// activations) and the tensors the stage sends and receives for it.
type slot struct {
	net  *models.Network
	in   []float32 // received activation (not on the first stage)
	out  []float32 // the Forward's output, owned by net's layers
	dout []float32 // received gradient, or the loss's on the last stage
	dx   []float32 // the Backward's input gradient, owned by net's layers
	mb   int
}

// Executor runs one pipeline stage's plan, step after step. It is not
// safe for concurrent use; the stage's goroutine calls Step.
type Executor struct {
	cfg           Config
	st            models.Stage
	first, last   bool
	micro         int // samples per micro-batch
	inLen, outLen int // values per sample entering and leaving the stage
	slots         []*slot
	free          []*slot
	held          map[int]*slot // micro-batches in flight
	failed        error
	now           func() time.Time
}

// New checks cfg and readies the stage: it builds one twin of the network
// per micro-batch the plan holds in flight at once on this stage (M under
// GPipe, min(M, S−s) under 1F1B) and finds the shapes at the stage's
// boundaries.
func New(cfg Config) (*Executor, error) {
	if cfg.Net == nil {
		return nil, errors.New("stage: Config.Net is nil")
	}
	if err := cfg.Plan.Validate(); err != nil {
		return nil, err
	}
	S, M := cfg.Plan.Stages, cfg.Plan.MicroBatches
	if len(cfg.Stages) != S {
		return nil, fmt.Errorf("stage: %d model stages for a plan of %d stages", len(cfg.Stages), S)
	}
	if cfg.Stage < 0 || cfg.Stage >= S {
		return nil, fmt.Errorf("stage: stage %d out of [0, %d)", cfg.Stage, S)
	}
	if err := checkStages(cfg.Net, cfg.Stages); err != nil {
		return nil, err
	}
	if cfg.Batch < M || cfg.Batch%M != 0 {
		return nil, fmt.Errorf("stage: batch %d is not a positive multiple of %d micro-batches", cfg.Batch, M)
	}
	e := &Executor{cfg: cfg, st: cfg.Stages[cfg.Stage], first: cfg.Stage == 0, last: cfg.Stage == S-1,
		micro: cfg.Batch / M, held: map[int]*slot{}, now: cfg.Now}
	if e.now == nil {
		e.now = time.Now
	}
	if (cfg.Prev == nil) != e.first || (cfg.Next == nil) != e.last {
		return nil, fmt.Errorf("stage: stage %d of %d has Prev %v and Next %v; want a Prev link exactly when it is not the first stage and a Next link exactly when it is not the last",
			cfg.Stage, S, cfg.Prev != nil, cfg.Next != nil)
	}
	// The boundary shapes, from one sample run forward in evaluation mode
	// on a twin (nothing of the network changes).
	probe := cfg.Net.Twin()
	x := make([]float32, cfg.Net.InputSize())
	for s := 0; s <= cfg.Stage; s++ {
		if s == cfg.Stage {
			e.inLen = len(x)
		}
		x = probe.ForwardStage(cfg.Stages[s], x, 1, false)
	}
	e.outLen = len(x)
	peak := peakHeld(cfg.Plan.Actions[cfg.Stage], e.first)
	for i := range peak {
		n := cfg.Net
		if i > 0 {
			n = cfg.Net.Twin()
		}
		sl := &slot{net: n, dout: make([]float32, e.micro*e.outLen)}
		if !e.first {
			sl.in = make([]float32, e.micro*e.inLen)
		}
		e.slots = append(e.slots, sl)
	}
	e.free = append(e.free, e.slots...)
	return e, nil
}

// checkStages checks that stages cut net as models.Partition does: runs
// of net's own blocks, in order, that together are all of them, each
// stage's ranges those of its blocks.
func checkStages(net *models.Network, stages []models.Stage) error {
	blocks := net.Blocks()
	at := 0
	for s, st := range stages {
		bad := func(why string) error {
			return fmt.Errorf("stage: stage %d is not a stage of %s's partition (models.Partition): %s", s, net.Name(), why)
		}
		if len(st.Blocks) == 0 || at+len(st.Blocks) > len(blocks) {
			return bad(fmt.Sprintf("%d blocks from block %d of %d", len(st.Blocks), at, len(blocks)))
		}
		for i, b := range st.Blocks {
			if b != blocks[at+i] {
				return bad(fmt.Sprintf("its block %d is %+v, want %+v", i, b, blocks[at+i]))
			}
		}
		f, l := st.Blocks[0], st.Blocks[len(st.Blocks)-1]
		if st.First != f.First || st.End != l.End || st.ParamOffset != f.ParamOffset || st.ParamLen != l.ParamOffset+l.ParamLen-f.ParamOffset ||
			st.BufferOffset != f.BufferOffset || st.BufferLen != l.BufferOffset+l.BufferLen-f.BufferOffset {
			return bad("its ranges are not its blocks'")
		}
		at += len(st.Blocks)
	}
	if at != len(blocks) {
		return fmt.Errorf("stage: the stages hold %d of %s's %d blocks: not its partition (models.Partition)", at, net.Name(), len(blocks))
	}
	return nil
}

// peakHeld is the most micro-batches acts holds at once, counted as the
// executor holds them: from the RecvActivation (the Forward on the first
// stage) to the SendGrad (the Backward on the first stage).
func peakHeld(acts []pipeline.Action, first bool) int {
	held, peak := 0, 0
	for _, a := range acts {
		switch {
		case a.Op == pipeline.RecvActivation || first && a.Op == pipeline.Forward:
			held++
			peak = max(peak, held)
		case a.Op == pipeline.SendGrad || first && a.Op == pipeline.Backward:
			held--
		}
	}
	return peak
}

// InShape and OutShape are the shapes of a micro-batch's tensors entering
// and leaving the stage: (samples, values per sample).
func (e *Executor) InShape() [2]int  { return [2]int{e.micro, e.inLen} }
func (e *Executor) OutShape() [2]int { return [2]int{e.micro, e.outLen} }

// Slots is the number of micro-batches the stage can hold in flight: the
// plan's peak for this stage.
func (e *Executor) Slots() int { return len(e.slots) }

// StepError is a failed step of one stage: where in its plan it stopped
// and why. A *PeerError in Err names the neighbour that failed.
// Eval says it was an evaluation pass (Infer) and Step its number.
type StepError struct {
	Stage  int
	Step   int64
	Eval   bool
	Action pipeline.Action
	Err    error
}

func (e *StepError) Error() string {
	kind := "step"
	if e.Eval {
		kind = "evaluation"
	}
	return fmt.Sprintf("pipeline: stage %d at %v of %s %d: %v", e.Stage, e.Action, kind, e.Step, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Step runs the stage's plan once: the Forwards and Backwards of the
// step's micro-batches in the plan's order, receiving and sending
// activations and gradients on the links. The Backwards add into the
// stage's part of the network's gradient buffer, micro-batch 0 first; the
// caller clears it before the step and steps the optimiser after.
//
// Micro-batch mb's loss gradient is weighted by its share of the batch,
// 1/M, exactly as a worker accumulating gradients over the same M
// micro-batches weights it, and its dropout masks are those of that
// worker's training Forward number step·M + mb: so the gradient is bit
// for bit that worker's (see the package doc).
//
// A failed step aborts both links with its error, so that the
// neighbours fail too instead of waiting, and returns a *StepError; the
// executor is not usable after it (its links are broken).
func (e *Executor) Step(ctx context.Context, step int64, in Input) (Stats, error) {
	if e.failed != nil {
		return Stats{}, fmt.Errorf("pipeline: stage %d: a failed executor is not reusable: %w", e.cfg.Stage, e.failed)
	}
	var st Stats
	start := e.now()
	err := e.run(ctx, step, in, &st)
	st.Wall = e.now().Sub(start)
	if err != nil {
		e.fail(err)
		return st, err
	}
	return st, nil
}

// fail marks the executor failed and aborts its links with err.
func (e *Executor) fail(err error) {
	e.failed = err
	for _, l := range []Link{e.cfg.Prev, e.cfg.Next} {
		if l != nil {
			l.Abort(err)
		}
	}
}

func (e *Executor) run(ctx context.Context, step int64, in Input, st *Stats) error {
	M := e.cfg.Plan.MicroBatches
	n := e.micro
	if e.first && len(in.X) != e.cfg.Batch*e.inLen {
		return &StepError{Stage: e.cfg.Stage, Step: step, Err: fmt.Errorf("input of %d values, want batch %d × %d", len(in.X), e.cfg.Batch, e.inLen)}
	}
	if e.last && in.Loss == nil {
		return &StepError{Stage: e.cfg.Stage, Step: step, Err: errors.New("the last stage needs Input.Loss")}
	}
	clear(e.held)
	e.free = append(e.free[:0], e.slots...)
	var loss float64
	for _, a := range e.cfg.Plan.Actions[e.cfg.Stage] {
		fail := func(err error) error { return &StepError{Stage: e.cfg.Stage, Step: step, Action: a, Err: err} }
		if err := ctx.Err(); err != nil {
			return fail(context.Cause(ctx))
		}
		mb := a.MicroBatch
		if a.Op == pipeline.RecvActivation || e.first && a.Op == pipeline.Forward {
			if len(e.free) == 0 {
				panic(fmt.Sprintf("stage: stage %d: no free slot for micro-batch %d (the plan holds more than %d)", e.cfg.Stage, mb, len(e.slots)))
			}
			sl := e.free[len(e.free)-1]
			e.free = e.free[:len(e.free)-1]
			sl.mb = mb
			e.held[mb] = sl
			st.PeakInFlight = max(st.PeakInFlight, len(e.held))
		}
		sl := e.held[mb]
		if sl == nil {
			panic(fmt.Sprintf("stage: stage %d: %v of a micro-batch not in flight", e.cfg.Stage, a))
		}
		switch a.Op {
		case pipeline.RecvActivation:
			if err := e.cfg.Prev.Recv(ctx, e.header(step, mb, Activation, e.inLen), sl.in); err != nil {
				return fail(err)
			}
			st.BytesFromPrev += 4 * int64(len(sl.in))
		case pipeline.Forward:
			t0 := e.now()
			x := sl.in
			if e.first {
				x = in.X[mb*n*e.inLen : (mb+1)*n*e.inLen]
			}
			sl.net.SetDropoutCalls(uint64(step)*uint64(M) + uint64(mb))
			sl.out = sl.net.ForwardStage(e.st, x, n, true)
			if e.last {
				l := in.Loss(mb, sl.out, sl.dout)
				loss += float64(l) * float64(n)
				if M > 1 {
					// As the worker's gradient accumulation weights it.
					w := float32(n) / float32(e.cfg.Batch)
					for i := range sl.dout {
						sl.dout[i] *= w
					}
				}
			}
			if err := e.spend(ctx, t0, e.cfg.Cost.Forward, st); err != nil {
				return fail(err)
			}
		case pipeline.SendActivation:
			if err := e.cfg.Next.Send(ctx, e.header(step, mb, Activation, e.outLen), sl.out); err != nil {
				return fail(err)
			}
			st.BytesToNext += 4 * int64(len(sl.out))
		case pipeline.RecvGrad:
			if err := e.cfg.Next.Recv(ctx, e.header(step, mb, Gradient, e.outLen), sl.dout); err != nil {
				return fail(err)
			}
			st.BytesFromNext += 4 * int64(len(sl.dout))
		case pipeline.Backward:
			t0 := e.now()
			sl.dx = sl.net.BackwardStage(e.st, sl.dout)
			if err := e.spend(ctx, t0, e.cfg.Cost.Backward, st); err != nil {
				return fail(err)
			}
			if e.first {
				e.release(sl)
			}
		case pipeline.SendGrad:
			if len(sl.dx) != n*e.inLen {
				return fail(fmt.Errorf("the Backward gave an input gradient of %d values, want %d×%d", len(sl.dx), n, e.inLen))
			}
			if err := e.cfg.Prev.Send(ctx, e.header(step, mb, Gradient, e.inLen), sl.dx); err != nil {
				return fail(err)
			}
			st.BytesToPrev += 4 * int64(len(sl.dx))
			e.release(sl)
		default:
			return fail(fmt.Errorf("unknown operation %v", a.Op))
		}
	}
	if e.last {
		st.Loss = float32(loss / float64(e.cfg.Batch))
	}
	return nil
}

func (e *Executor) header(step int64, mb int, d Direction, perSample int) Header {
	return Header{Step: step, MicroBatch: mb, Dir: d, Shape: [2]int{e.micro, perSample}}
}

func (e *Executor) release(sl *slot) {
	delete(e.held, sl.mb)
	sl.out, sl.dx = nil, nil
	e.free = append(e.free, sl)
}

// spend counts a computation that started at t0 as busy time, first
// waiting out the rest of cost (if any) after it.
func (e *Executor) spend(ctx context.Context, t0 time.Time, cost time.Duration, st *Stats) error {
	if rest := cost - e.now().Sub(t0); rest > 0 {
		t := time.NewTimer(rest)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	st.Busy += e.now().Sub(t0)
	return nil
}
