package pipeline

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// SimConfig sets up Simulate: link capacities, costs on a fake clock and
// optional seeded random delays.
type SimConfig struct {
	// Capacity is how many messages one direction of a link holds between
	// their send and their receive; 0 is a rendezvous (a send completes
	// only together with its receive).
	Capacity int
	// Forward and Backward are the cost of one micro-batch's forward and
	// backward on any stage; Latency the time from a send to the message
	// being receivable. Zero costs are allowed.
	Forward, Backward, Latency int64
	// Rand, when set, adds a delay uniform in [0, Jitter] to every
	// computation and every transfer, drawn in the order the simulation
	// runs them (so a seed fixes the whole run).
	Rand   *rand.Rand
	Jitter int64
}

// StageStats is what Simulate saw one stage do.
type StageStats struct {
	Busy int64 // time spent in Forward and Backward
	// PeakInFlight is the most micro-batches the stage held activations
	// for at once: forwarded and not yet backwarded.
	PeakInFlight int
	// Forwards and Backwards are the micro-batches in the order the stage
	// ran them; Backwards is the order its gradients accumulate in.
	Forwards, Backwards []int
}

// SimResult is the outcome of Simulate.
type SimResult struct {
	Makespan int64 // when the last stage finished; the step started at 0
	Stages   []StageStats
}

// Idle is stage s's idle time in the step: Makespan − Busy.
func (r SimResult) Idle(s int) int64 { return r.Makespan - r.Stages[s].Busy }

// channel is one direction of one link: the times its messages became
// receivable and were received, in order.
type channel struct {
	visible, received []int64
	mbs               []int
}

// Simulate runs every stage's plan together as a discrete-event
// simulation on a fake clock: each stage runs its list in order; a
// receive waits for its message, a send for a free slot on its link (or,
// with Capacity 0, for the receiver). At every step it fires the enabled
// action with the earliest time (lowest stage first on ties), so the run
// is a pure function of the plan and the configuration. It returns an
// error naming every stage's blocked action if the stages deadlock, or if
// a receive gets a micro-batch other than the one its plan expects.
func Simulate(p Plan, c SimConfig) (SimResult, error) {
	if err := checkShape(p.Stages, p.MicroBatches); err != nil {
		return SimResult{}, err
	}
	if len(p.Actions) != p.Stages {
		return SimResult{}, fmt.Errorf("pipeline: %d stage lists for %d stages", len(p.Actions), p.Stages)
	}
	if c.Capacity < 0 {
		return SimResult{}, fmt.Errorf("pipeline: negative link capacity %d", c.Capacity)
	}
	jitter := func() int64 {
		if c.Rand == nil || c.Jitter <= 0 {
			return 0
		}
		return c.Rand.Int64N(c.Jitter + 1)
	}
	var (
		pc    = make([]int, p.Stages)
		clock = make([]int64, p.Stages) // when each stage is free for its next action
		held  = make([]int, p.Stages)
		chans = map[link]*channel{}
		res   = SimResult{Stages: make([]StageStats, p.Stages)}
	)
	ch := func(l link) *channel {
		if chans[l] == nil {
			chans[l] = &channel{}
		}
		return chans[l]
	}
	peerOf := func(s int, l link) int {
		if l.upper == s {
			return s + 1
		}
		return l.upper
	}
	// enabled says whether stage s's next action can fire and when.
	enabled := func(s int) (int64, bool) {
		a := p.Actions[s][pc[s]]
		l, send, ok := endpoint(s, a)
		if !ok {
			return clock[s], true
		}
		q := ch(l)
		if c.Capacity == 0 {
			peer := peerOf(s, l)
			if pc[peer] == len(p.Actions[peer]) {
				return 0, false
			}
			pl, psend, ok := endpoint(peer, p.Actions[peer][pc[peer]])
			if !ok || pl != l || psend == send {
				return 0, false
			}
			return max(clock[s], clock[peer]), true
		}
		if send {
			n := len(q.visible)
			if n < c.Capacity {
				return clock[s], true
			}
			if n-c.Capacity < len(q.received) {
				return max(clock[s], q.received[n-c.Capacity]), true
			}
			return 0, false
		}
		n := len(q.received)
		if n < len(q.visible) {
			return max(clock[s], q.visible[n]), true
		}
		return 0, false
	}
	receive := func(s int, a Action, q *channel, t int64) error {
		mb := q.mbs[len(q.received)]
		q.received = append(q.received, t)
		if mb != a.MicroBatch {
			return fmt.Errorf("pipeline: stage %d at %v received micro-batch %d", s, a, mb)
		}
		return nil
	}
	for {
		best, bestT := -1, int64(0)
		for s := range p.Stages {
			if pc[s] == len(p.Actions[s]) {
				continue
			}
			if t, ok := enabled(s); ok && (best < 0 || t < bestT) {
				best, bestT = s, t
			}
		}
		if best < 0 {
			var waits []string
			for s := range p.Stages {
				if pc[s] < len(p.Actions[s]) {
					waits = append(waits, fmt.Sprintf("stage %d at %v", s, p.Actions[s][pc[s]]))
				}
			}
			if len(waits) == 0 {
				break
			}
			return res, fmt.Errorf("pipeline: deadlock: %s", strings.Join(waits, ", "))
		}
		s, t := best, bestT
		a := p.Actions[s][pc[s]]
		pc[s]++
		st := &res.Stages[s]
		l, send, isComm := endpoint(s, a)
		switch {
		case a.Op == Forward || a.Op == Backward:
			cost := c.Forward
			if a.Op == Forward {
				held[s]++
				st.PeakInFlight = max(st.PeakInFlight, held[s])
				st.Forwards = append(st.Forwards, a.MicroBatch)
			} else {
				cost = c.Backward
				held[s]--
				st.Backwards = append(st.Backwards, a.MicroBatch)
			}
			cost += jitter()
			st.Busy += cost
			clock[s] = t + cost
		case isComm && c.Capacity == 0:
			// A rendezvous: both ends complete together.
			peer := peerOf(s, l)
			pa := p.Actions[peer][pc[peer]]
			pc[peer]++
			done := t + c.Latency + jitter()
			clock[s], clock[peer] = done, done
			recvStage, recvAct, sentMB := peer, pa, a.MicroBatch
			if !send {
				recvStage, recvAct, sentMB = s, a, pa.MicroBatch
			}
			q := ch(l)
			q.visible = append(q.visible, done)
			q.mbs = append(q.mbs, sentMB)
			if err := receive(recvStage, recvAct, q, done); err != nil {
				return res, err
			}
		case isComm && send:
			q := ch(l)
			q.visible = append(q.visible, t+c.Latency+jitter())
			q.mbs = append(q.mbs, a.MicroBatch)
			clock[s] = t
		case isComm:
			if err := receive(s, a, ch(l), t); err != nil {
				return res, err
			}
			clock[s] = t
		default:
			return res, fmt.Errorf("pipeline: stage %d: unknown operation %v", s, a.Op)
		}
	}
	for s := range p.Stages {
		res.Makespan = max(res.Makespan, clock[s])
	}
	return res, nil
}
