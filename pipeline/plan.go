package pipeline

import (
	"fmt"
	"strconv"
)

// Op is what one step of a stage's plan does.
type Op uint8

// The operations of a plan. A stage s sends activations to s+1 and
// gradients to s−1, and receives them from the same neighbours.
const (
	Forward        Op = iota + 1 // run the stage's layers forward on a micro-batch
	Backward                     // run them backward, adding into the stage's gradients
	RecvActivation               // receive a micro-batch's input activation from stage s−1
	SendActivation               // send a micro-batch's output activation to stage s+1
	RecvGrad                     // receive the gradient of a micro-batch's output from stage s+1
	SendGrad                     // send the gradient of a micro-batch's input to stage s−1
)

var opNames = [...]string{
	Forward: "Forward", Backward: "Backward",
	RecvActivation: "RecvActivation", SendActivation: "SendActivation",
	RecvGrad: "RecvGrad", SendGrad: "SendGrad",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Action is one step of a stage's plan: an operation on a micro-batch.
type Action struct {
	Op         Op
	MicroBatch int // 0 ≤ MicroBatch < Plan.MicroBatches
}

func (a Action) String() string { return a.Op.String() + "(" + strconv.Itoa(a.MicroBatch) + ")" }

// Schedule names an order of forwards and backwards.
type Schedule string

// The schedules. Both flush: every micro-batch of a step is backwarded
// before the step ends, so a step's gradient is the whole batch's.
const (
	ScheduleGPipe    Schedule = "gpipe" // all forwards, then all backwards (Huang et al. 2019)
	ScheduleOneFOneB Schedule = "1f1b"  // PipeDream-Flush (Narayanan et al. 2021)
)

// Schedules lists the known schedules.
func Schedules() []Schedule { return []Schedule{ScheduleGPipe, ScheduleOneFOneB} }

// Plan is a schedule laid out for S stages and M micro-batches: for every
// stage, the ordered list of actions it runs in one training step. A
// stage's shell runs its list front to back, each action to completion;
// nothing else is needed for the step to finish (see the package doc).
type Plan struct {
	Schedule             Schedule
	Stages, MicroBatches int
	Actions              [][]Action // Actions[s] is stage s's list
}

// New lays out the named schedule for stages and microBatches.
func New(sched Schedule, stages, microBatches int) (Plan, error) {
	switch sched {
	case ScheduleGPipe:
		return GPipe(stages, microBatches)
	case ScheduleOneFOneB:
		return OneFOneB(stages, microBatches)
	}
	return Plan{}, fmt.Errorf("pipeline: unknown schedule %q (known: %s, %s)", sched, ScheduleGPipe, ScheduleOneFOneB)
}

func checkShape(stages, microBatches int) error {
	if stages < 1 {
		return fmt.Errorf("pipeline: stages must be at least 1, got %d", stages)
	}
	if microBatches < 1 {
		return fmt.Errorf("pipeline: micro-batches must be at least 1, got %d", microBatches)
	}
	return nil
}

// stagePlan appends one stage's actions; it knows which neighbours exist.
type stagePlan struct {
	first, last bool // no stage before / after this one
	acts        []Action
}

func (p *stagePlan) add(op Op, mb int) { p.acts = append(p.acts, Action{op, mb}) }

// recvAct, sendAct, recvGrad and sendGrad add a transfer when the stage
// has the neighbour it goes to or comes from.
func (p *stagePlan) recvAct(mb int) {
	if !p.first {
		p.add(RecvActivation, mb)
	}
}

func (p *stagePlan) sendAct(mb int) {
	if !p.last {
		p.add(SendActivation, mb)
	}
}

func (p *stagePlan) recvGrad(mb int) {
	if !p.last {
		p.add(RecvGrad, mb)
	}
}

func (p *stagePlan) sendGrad(mb int) {
	if !p.first {
		p.add(SendGrad, mb)
	}
}

// GPipe lays out GPipe: on every stage, the M forwards in micro-batch
// order, then the M backwards in micro-batch order (the order gradients
// accumulate in; see the package doc). Every stage holds the activations
// of all M micro-batches before its first backward.
func GPipe(stages, microBatches int) (Plan, error) {
	if err := checkShape(stages, microBatches); err != nil {
		return Plan{}, err
	}
	plan := Plan{Schedule: ScheduleGPipe, Stages: stages, MicroBatches: microBatches, Actions: make([][]Action, stages)}
	for s := range stages {
		p := stagePlan{first: s == 0, last: s == stages-1}
		for mb := range microBatches {
			p.recvAct(mb)
			p.add(Forward, mb)
			p.sendAct(mb)
		}
		for mb := range microBatches {
			p.recvGrad(mb)
			p.add(Backward, mb)
			p.sendGrad(mb)
		}
		plan.Actions[s] = p.acts
	}
	return plan, nil
}

// OneFOneB lays out 1F1B with a flush (PipeDream-Flush): stage s first
// runs w = min(S−1−s, M) warm-up forwards, then alternates one forward of
// micro-batch w+i with one backward of micro-batch i, then runs the
// remaining backwards (cool-down). Backwards run in micro-batch order, as
// in GPipe, so both schedules accumulate the same gradient bit for bit. A
// stage holds at most min(M, S−s) micro-batches of activations.
//
// In the steady phase the activation of forward w+i is sent to s+1 only
// after the gradient of micro-batch i has been received from s+1: that is
// the order in which s+1 wants them (it sends gradient i before it
// receives activation w+i), so both ends of every link agree on the order
// of its messages and the plan needs no link buffer at all.
func OneFOneB(stages, microBatches int) (Plan, error) {
	if err := checkShape(stages, microBatches); err != nil {
		return Plan{}, err
	}
	plan := Plan{Schedule: ScheduleOneFOneB, Stages: stages, MicroBatches: microBatches, Actions: make([][]Action, stages)}
	for s := range stages {
		p := stagePlan{first: s == 0, last: s == stages-1}
		warm := min(stages-1-s, microBatches)
		for mb := range warm {
			p.recvAct(mb)
			p.add(Forward, mb)
			p.sendAct(mb)
		}
		for i := range microBatches - warm {
			f := warm + i
			p.recvAct(f)
			p.add(Forward, f)
			p.recvGrad(i)
			p.sendAct(f)
			p.add(Backward, i)
			p.sendGrad(i)
		}
		for b := microBatches - warm; b < microBatches; b++ {
			p.recvGrad(b)
			p.add(Backward, b)
			p.sendGrad(b)
		}
		plan.Actions[s] = p.acts
	}
	return plan, nil
}

// Bubble is the fraction of a step each stage spends idle under GPipe or
// 1F1B when every micro-batch's forward and backward cost the same on
// every stage and transfers are free: (S−1)/(M+S−1). Each stage works
// M·(f+b) out of a step of (M+S−1)·(f+b).
func Bubble(stages, microBatches int) float64 {
	if stages < 1 || microBatches < 1 {
		return 0
	}
	return float64(stages-1) / float64(microBatches+stages-1)
}
