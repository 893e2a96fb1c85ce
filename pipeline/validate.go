package pipeline

import (
	"fmt"
	"slices"
	"strings"
)

// link identifies one direction of the link between stages s and s+1:
// activations flow down it (s → s+1), gradients up (s+1 → s).
type link struct {
	upper int  // s, the lower-numbered stage
	grad  bool // the gradient direction, s+1 → s
}

// endpoint returns the link an action's transfer uses and whether the
// stage is its sender, or ok = false for a computation.
func endpoint(stage int, a Action) (l link, send, ok bool) {
	switch a.Op {
	case SendActivation:
		return link{stage, false}, true, true
	case RecvActivation:
		return link{stage - 1, false}, false, true
	case SendGrad:
		return link{stage - 1, true}, true, true
	case RecvGrad:
		return link{stage, true}, false, true
	}
	return link{}, false, false
}

// Validate checks that p can run to the end whatever the delays and link
// capacities (rendezvous included), and that it trains what one worker
// would: every stage forwards and backwards every micro-batch exactly
// once, receives a micro-batch's input before forwarding it and sends
// its output after, likewise for backwards; both ends of every link see
// the same messages in the same order; and the plan, with every transfer
// taken as one event shared by its two ends, has no cycle (the argument
// is in the package doc).
func (p Plan) Validate() error {
	if err := checkShape(p.Stages, p.MicroBatches); err != nil {
		return err
	}
	if len(p.Actions) != p.Stages {
		return fmt.Errorf("pipeline: %d stage lists for %d stages", len(p.Actions), p.Stages)
	}
	for s, acts := range p.Actions {
		if err := p.validateStage(s, acts); err != nil {
			return err
		}
	}
	return p.validateOrder()
}

// validateStage checks one stage's list on its own.
func (p Plan) validateStage(s int, acts []Action) error {
	const (
		got = 1 << iota
		fwd
		sent
		gotGrad
		bwd
		sentGrad
	)
	first, last := s == 0, s == p.Stages-1
	state := make([]int, p.MicroBatches)
	for i, a := range acts {
		if a.MicroBatch < 0 || a.MicroBatch >= p.MicroBatches {
			return fmt.Errorf("pipeline: stage %d action %d: %v: micro-batch out of range [0, %d)", s, i, a, p.MicroBatches)
		}
		st := &state[a.MicroBatch]
		var need, set int
		switch a.Op {
		case RecvActivation:
			need, set = 0, got
		case Forward:
			need, set = got, fwd
			if first {
				need = 0
			}
		case SendActivation:
			need, set = fwd, sent
		case RecvGrad:
			need, set = fwd, gotGrad
		case Backward:
			need, set = gotGrad|fwd, bwd
			if last {
				need = fwd
			}
		case SendGrad:
			need, set = bwd, sentGrad
		default:
			return fmt.Errorf("pipeline: stage %d action %d: unknown operation %v", s, i, a.Op)
		}
		if (a.Op == RecvActivation || a.Op == SendGrad) && first || (a.Op == SendActivation || a.Op == RecvGrad) && last {
			return fmt.Errorf("pipeline: stage %d action %d: %v has no neighbour on that side", s, i, a)
		}
		if *st&need != need {
			return fmt.Errorf("pipeline: stage %d action %d: %v comes before what it needs", s, i, a)
		}
		if *st&set != 0 {
			return fmt.Errorf("pipeline: stage %d action %d: %v is repeated", s, i, a)
		}
		*st |= set
	}
	want := fwd | bwd
	if !first {
		want |= got | sentGrad
	}
	if !last {
		want |= sent | gotGrad
	}
	for mb, st := range state {
		if st != want {
			return fmt.Errorf("pipeline: stage %d does not run every step of micro-batch %d", s, mb)
		}
	}
	return nil
}

// validateOrder checks that every link's two ends agree on its messages
// and that no set of stages can wait on one another: it runs the plan
// with rendezvous links, firing any computation and any transfer whose
// two ends are both ready, and fails if it gets stuck. Stuck with
// rendezvous means a cycle, and with no cycle no capacity can get stuck.
func (p Plan) validateOrder() error {
	for s := range p.Stages - 1 {
		for _, grad := range []bool{false, true} {
			var sends, recvs []int
			for t, acts := range p.Actions[s : s+2] {
				for _, a := range acts {
					if l, send, ok := endpoint(s+t, a); ok && l == (link{s, grad}) {
						if send {
							sends = append(sends, a.MicroBatch)
						} else {
							recvs = append(recvs, a.MicroBatch)
						}
					}
				}
			}
			if !slices.Equal(sends, recvs) {
				dir := "activations"
				if grad {
					dir = "gradients"
				}
				return fmt.Errorf("pipeline: %s between stages %d and %d are sent in the order %v and received in the order %v", dir, s, s+1, sends, recvs)
			}
		}
	}
	pc := make([]int, p.Stages)
	for {
		moved, done := false, true
		for s := range p.Stages {
			if pc[s] == len(p.Actions[s]) {
				continue
			}
			done = false
			a := p.Actions[s][pc[s]]
			l, send, ok := endpoint(s, a)
			if !ok {
				pc[s]++
				moved = true
				continue
			}
			peer := l.upper
			if peer == s {
				peer = s + 1
			}
			if pc[peer] < len(p.Actions[peer]) {
				b := p.Actions[peer][pc[peer]]
				if pl, psend, ok := endpoint(peer, b); ok && pl == l && psend != send && b.MicroBatch == a.MicroBatch {
					pc[s]++
					pc[peer]++
					moved = true
				}
			}
		}
		if done {
			return nil
		}
		if !moved {
			var waits []string
			for s := range p.Stages {
				if pc[s] < len(p.Actions[s]) {
					waits = append(waits, fmt.Sprintf("stage %d at %v", s, p.Actions[s][pc[s]]))
				}
			}
			return fmt.Errorf("pipeline: %s plan for %d stages and %d micro-batches can deadlock: %s", p.Schedule, p.Stages, p.MicroBatches, strings.Join(waits, ", "))
		}
	}
}
