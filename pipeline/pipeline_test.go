package pipeline

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// each runs f for every schedule, S in 1..8 and M in 1..16: fewer
// micro-batches than stages, as many, and more.
func each(t *testing.T, f func(t *testing.T, p Plan)) {
	t.Helper()
	for _, sched := range Schedules() {
		for s := 1; s <= 8; s++ {
			for m := 1; m <= 16; m++ {
				p, err := New(sched, s, m)
				if err != nil {
					t.Fatalf("New(%s, %d, %d): %v", sched, s, m, err)
				}
				t.Run(fmt.Sprintf("%s/S=%d/M=%d", sched, s, m), func(t *testing.T) { f(t, p) })
			}
		}
	}
}

func TestPlansValidate(t *testing.T) {
	each(t, func(t *testing.T, p Plan) {
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

// Every micro-batch is forwarded once and backwarded once on every stage,
// backward after forward, and gradients accumulate in micro-batch order
// on every stage under both schedules — the order that decides the bits
// of the step's gradient.
func TestEveryMicroBatchOnceInOrder(t *testing.T) {
	each(t, func(t *testing.T, p Plan) {
		want := make([]int, p.MicroBatches)
		for i := range want {
			want[i] = i
		}
		for s, acts := range p.Actions {
			var fwd, bwd []int
			pos := map[int]int{}
			for i, a := range acts {
				switch a.Op {
				case Forward:
					fwd = append(fwd, a.MicroBatch)
					pos[a.MicroBatch] = i
				case Backward:
					if f, ok := pos[a.MicroBatch]; !ok || f > i {
						t.Fatalf("stage %d: %v before its forward", s, a)
					}
					bwd = append(bwd, a.MicroBatch)
				}
			}
			if !slices.Equal(fwd, want) || !slices.Equal(bwd, want) {
				t.Fatalf("stage %d: forwards %v, backwards %v, want each %v", s, fwd, bwd, want)
			}
		}
	})
}

// The sweep runs every plan against bounded links (rendezvous, 1, 2 and
// 4 messages) with random delays on every computation and transfer, from
// several seeds: every run finishes, and every stage ran every
// micro-batch forward and backward, backwards in micro-batch order.
func TestNoDeadlockWithRandomDelays(t *testing.T) {
	each(t, func(t *testing.T, p Plan) {
		for _, k := range []int{0, 1, 2, 4} {
			for seed := range uint64(3) {
				c := SimConfig{
					Capacity: k, Forward: 1, Backward: 2, Latency: 1,
					Rand: rand.New(rand.NewPCG(seed, uint64(k))), Jitter: 20,
				}
				r, err := Simulate(p, c)
				if err != nil {
					t.Fatalf("capacity %d seed %d: %v", k, seed, err)
				}
				for s, st := range r.Stages {
					if len(st.Forwards) != p.MicroBatches || !slices.IsSorted(st.Backwards) || len(st.Backwards) != p.MicroBatches {
						t.Fatalf("capacity %d seed %d stage %d: forwards %v backwards %v", k, seed, s, st.Forwards, st.Backwards)
					}
				}
			}
		}
	})
}

// Activations in flight: all M under GPipe, min(M, S−s) on stage s under
// 1F1B (whatever the delays: the plan fixes it).
func TestInFlightActivations(t *testing.T) {
	each(t, func(t *testing.T, p Plan) {
		c := SimConfig{Capacity: 1, Forward: 3, Backward: 5, Rand: rand.New(rand.NewPCG(1, 2)), Jitter: 7}
		r, err := Simulate(p, c)
		if err != nil {
			t.Fatal(err)
		}
		for s, st := range r.Stages {
			want := p.MicroBatches
			if p.Schedule == ScheduleOneFOneB {
				want = min(p.MicroBatches, p.Stages-s)
			}
			if st.PeakInFlight != want {
				t.Errorf("stage %d: %d micro-batches of activations in flight, want %d", s, st.PeakInFlight, want)
			}
		}
	})
}

// The bubble: with forward f and backward b on every stage and free
// transfers, the step lasts (M+S−1)(f+b) and each stage is idle for
// exactly (S−1)/(M+S−1) of it, under both schedules and any capacity.
func TestBubble(t *testing.T) {
	each(t, func(t *testing.T, p Plan) {
		for _, fb := range [][2]int64{{1, 1}, {1, 2}, {2, 3}, {3, 1}} {
			for _, k := range []int{0, 1, 3} {
				r, err := Simulate(p, SimConfig{Capacity: k, Forward: fb[0], Backward: fb[1]})
				if err != nil {
					t.Fatal(err)
				}
				s1, m := int64(p.Stages-1), int64(p.MicroBatches)
				if want := (m + s1) * (fb[0] + fb[1]); r.Makespan != want {
					t.Fatalf("f=%d b=%d capacity %d: step lasts %d, want %d", fb[0], fb[1], k, r.Makespan, want)
				}
				for s := range p.Stages {
					// idle/makespan == (S−1)/(M+S−1), compared exactly.
					if r.Idle(s)*(m+s1) != s1*r.Makespan {
						t.Errorf("f=%d b=%d capacity %d stage %d: idle %d of %d, want a fraction %v", fb[0], fb[1], k, s, r.Idle(s), r.Makespan, Bubble(p.Stages, p.MicroBatches))
					}
				}
			}
		}
	})
}

func TestBubbleFormula(t *testing.T) {
	for _, c := range []struct {
		s, m int
		want float64
	}{{1, 1, 0}, {1, 8, 0}, {2, 1, 0.5}, {4, 4, 3.0 / 7}, {4, 16, 3.0 / 19}, {8, 2, 7.0 / 9}, {0, 4, 0}, {4, 0, 0}} {
		if got := Bubble(c.s, c.m); got != c.want {
			t.Errorf("Bubble(%d, %d) = %v, want %v", c.s, c.m, got, c.want)
		}
	}
}

// The shapes are as documented, written out for small cases.
func TestPlanShapes(t *testing.T) {
	str := func(acts []Action) string {
		var b []string
		for _, a := range acts {
			op := map[Op]string{Forward: "F", Backward: "B", RecvActivation: "ra", SendActivation: "sa", RecvGrad: "rg", SendGrad: "sg"}[a.Op]
			b = append(b, fmt.Sprintf("%s%d", op, a.MicroBatch))
		}
		return strings.Join(b, " ")
	}
	for _, c := range []struct {
		sched Schedule
		s, m  int
		want  []string
	}{
		{ScheduleGPipe, 2, 2, []string{
			"F0 sa0 F1 sa1 rg0 B0 rg1 B1",
			"ra0 F0 ra1 F1 B0 sg0 B1 sg1"}},
		{ScheduleOneFOneB, 2, 3, []string{
			"F0 sa0 F1 rg0 sa1 B0 F2 rg1 sa2 B1 rg2 B2",
			"ra0 F0 B0 sg0 ra1 F1 B1 sg1 ra2 F2 B2 sg2"}},
		{ScheduleOneFOneB, 3, 1, []string{
			"F0 sa0 rg0 B0",
			"ra0 F0 sa0 rg0 B0 sg0",
			"ra0 F0 B0 sg0"}},
		{ScheduleOneFOneB, 1, 2, []string{"F0 B0 F1 B1"}},
	} {
		p, err := New(c.sched, c.s, c.m)
		if err != nil {
			t.Fatal(err)
		}
		for s, want := range c.want {
			if got := str(p.Actions[s]); got != want {
				t.Errorf("%s S=%d M=%d stage %d:\n got %s\nwant %s", c.sched, c.s, c.m, s, got, want)
			}
		}
	}
}

// The naive 1F1B order, which sends a forward's activation before
// receiving the gradient it waits for, deadlocks on rendezvous links:
// Validate and Simulate both say so, naming where every stage waits.
func TestNaiveOrderDeadlocks(t *testing.T) {
	p := Plan{Schedule: ScheduleOneFOneB, Stages: 2, MicroBatches: 2, Actions: [][]Action{
		{{Forward, 0}, {SendActivation, 0}, {Forward, 1}, {SendActivation, 1}, {RecvGrad, 0}, {Backward, 0}, {RecvGrad, 1}, {Backward, 1}},
		{{RecvActivation, 0}, {Forward, 0}, {Backward, 0}, {SendGrad, 0}, {RecvActivation, 1}, {Forward, 1}, {Backward, 1}, {SendGrad, 1}},
	}}
	err := p.Validate()
	if err == nil || !strings.Contains(err.Error(), "stage 0 at SendActivation(1), stage 1 at SendGrad(0)") {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := Simulate(p, SimConfig{Forward: 1, Backward: 1}); err == nil || !strings.Contains(err.Error(), "deadlock: stage 0 at SendActivation(1), stage 1 at SendGrad(0)") {
		t.Fatalf("Simulate with rendezvous: %v", err)
	}
	// One slot of buffer is enough for this order.
	if _, err := Simulate(p, SimConfig{Capacity: 1, Forward: 1, Backward: 1}); err != nil {
		t.Fatalf("Simulate with capacity 1: %v", err)
	}
}

func TestValidateRefuses(t *testing.T) {
	good, _ := GPipe(2, 2)
	for _, c := range []struct {
		name string
		edit func(p *Plan)
		want string
	}{
		{"missing stage", func(p *Plan) { p.Actions = p.Actions[:1] }, "1 stage lists for 2 stages"},
		{"out of range", func(p *Plan) { p.Actions[0][0].MicroBatch = 2 }, "micro-batch out of range"},
		{"repeated", func(p *Plan) { p.Actions[0][2] = p.Actions[0][0] }, "Forward(0) is repeated"},
		{"no neighbour", func(p *Plan) { p.Actions[0][0] = Action{RecvActivation, 0} }, "no neighbour"},
		{"too early", func(p *Plan) { p.Actions[1][0], p.Actions[1][1] = p.Actions[1][1], p.Actions[1][0] }, "Forward(0) comes before what it needs"},
		{"incomplete", func(p *Plan) { p.Actions[0] = p.Actions[0][:6] }, "does not run every step of micro-batch 1"},
		{"order", func(p *Plan) {
			p.Actions[1] = []Action{{RecvActivation, 0}, {Forward, 0}, {RecvActivation, 1}, {Forward, 1}, {Backward, 1}, {SendGrad, 1}, {Backward, 0}, {SendGrad, 0}}
		}, "gradients between stages 0 and 1 are sent in the order [1 0] and received in the order [0 1]"},
		{"shape", func(p *Plan) { p.MicroBatches = 0 }, "micro-batches must be at least 1"},
	} {
		p := good
		p.Actions = make([][]Action, len(good.Actions))
		for i := range good.Actions {
			p.Actions[i] = slices.Clone(good.Actions[i])
		}
		c.edit(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want %q", c.name, err, c.want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	for _, c := range []struct {
		sched Schedule
		s, m  int
		want  string
	}{
		{"zb", 2, 2, `unknown schedule "zb" (known: gpipe, 1f1b)`},
		{ScheduleGPipe, 0, 2, "stages must be at least 1, got 0"},
		{ScheduleOneFOneB, 2, 0, "micro-batches must be at least 1, got 0"},
	} {
		if _, err := New(c.sched, c.s, c.m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q, %d, %d) = %v, want %q", c.sched, c.s, c.m, err, c.want)
		}
	}
	if _, err := Simulate(Plan{Stages: 1, MicroBatches: 1, Actions: [][]Action{nil}}, SimConfig{Capacity: -1}); err == nil {
		t.Error("Simulate with a negative capacity: no error")
	}
}

// A receiver that expects another micro-batch than the one on the link is
// an error, not a silent swap.
func TestSimulateRefusesWrongMicroBatch(t *testing.T) {
	p := Plan{Schedule: ScheduleGPipe, Stages: 2, MicroBatches: 2, Actions: [][]Action{
		{{Forward, 0}, {SendActivation, 0}, {Forward, 1}, {SendActivation, 1}, {RecvGrad, 0}, {Backward, 0}, {RecvGrad, 1}, {Backward, 1}},
		{{RecvActivation, 1}, {Forward, 1}, {RecvActivation, 0}, {Forward, 0}, {Backward, 0}, {SendGrad, 0}, {Backward, 1}, {SendGrad, 1}},
	}}
	for _, k := range []int{0, 2} {
		if _, err := Simulate(p, SimConfig{Capacity: k}); err == nil || !strings.Contains(err.Error(), "stage 1 at RecvActivation(1) received micro-batch 0") {
			t.Errorf("capacity %d: %v", k, err)
		}
	}
}
