package coordinator

import (
	"slices"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The straggler rule. The delay attributed to a rank is, per step, how
// long its data arrives after the others': in ring mode its right
// neighbour's wait for its first frame of each collective, in ps mode how
// far its gradient's last frame trails the first rank's. A rank is a
// straggler when its delay is at least StragglerMinDelay and at least
// StragglerFactor times the median of the other ranks' delays in
// StragglerReports consecutive reports; the episode ends when its delay
// falls below half of StragglerMinDelay. Ordinary jitter (a few ms on
// loopback, a GC pause in one report) stays far below that.
const (
	StragglerMinDelay = 50 * time.Millisecond
	StragglerFactor   = 3
	StragglerReports  = 2
)

// Stragglers applies the straggler rule to one generation of a job:
// Observe takes each report's delay, attributed to the rank that caused
// it. The caller owns clocks and reporting.
type Stragglers struct {
	gen     uint64
	delay   []float64 // seconds per step, latest report, by rank
	known   []bool    // a delay has been reported for the rank
	strikes []int     // consecutive reports that met the rule
	active  []bool    // in a reported straggler episode
}

// NewStragglers starts the rule for generation gen of world ranks.
func NewStragglers(gen uint64, world int) *Stragglers {
	return &Stragglers{gen: gen, delay: make([]float64, world), known: make([]bool, world),
		strikes: make([]int, world), active: make([]bool, world)}
}

// For reports whether d follows generation gen of world ranks (a new
// generation starts a new detector).
func (d *Stragglers) For(gen uint64, world int) bool {
	return d != nil && d.gen == gen && len(d.delay) == world
}

// Observe records that rank delayed each step by delay seconds (in the
// latest report) and says whether a straggler episode of rank begins or
// ends with it; median is the other ranks' median delay.
func (d *Stragglers) Observe(rank int, delay float64) (begins, ends bool, median float64) {
	d.delay[rank], d.known[rank] = delay, true
	var others []float64
	for r, v := range d.delay {
		if r != rank && d.known[r] {
			others = append(others, v)
		}
	}
	if len(others) == 0 {
		return false, false, 0
	}
	slices.Sort(others)
	median = others[len(others)/2]
	if len(others)%2 == 0 {
		median = (others[len(others)/2-1] + others[len(others)/2]) / 2
	}
	slow := delay >= StragglerMinDelay.Seconds() && delay >= StragglerFactor*median
	switch {
	case slow:
		d.strikes[rank]++
		if d.strikes[rank] >= StragglerReports && !d.active[rank] {
			d.active[rank] = true
			return true, false, median
		}
	case d.active[rank] && delay < StragglerMinDelay.Seconds()/2:
		d.strikes[rank], d.active[rank] = 0, false
		return false, true, median
	default:
		d.strikes[rank] = 0
	}
	return false, false, median
}

// RingDelayCulprit is the rank a ring progress report's left wait is
// blamed on: rank r waits for its left neighbour's frames.
func RingDelayCulprit(r, world int) int { return (r + world - 1) % world }

// Progress: rank Rank (Worker) of generation Generation of Job reported
// its progress at step Step. LeftWait is a ring rank's wait for its left
// neighbour's data per step; Lag (when HasLag) how far a ps rank's
// gradient trailed the first rank's, as its parameter server measured.
type Progress struct {
	At          time.Time
	Job, Worker string
	Generation  uint64
	Rank        int
	Step        int64
	LeftWait    float64
	Lag         float64
	HasLag      bool
}

func (i Progress) when() time.Time { return i.At }

// Straggler: a straggler episode of rank Rank (Worker, at Address) of
// Job's generation Generation begins (Ends false) or ends, at the report
// of step Step: it delays every step by Delay seconds while the other
// ranks' median is Median. Mode is the job's mode.
type Straggler struct {
	Job, Worker, Address, Mode string
	Generation                 uint64
	Rank                       int
	Step                       int64
	Delay, Median              float64
	Ends                       bool
}

func (Straggler) action() {}

// progress applies the straggler rule to one progress report: in ring
// mode the report's left wait is the delay of the rank's left
// neighbour; in ps mode the parameter server measured the rank's own.
// An episode is reported once as it begins, and once as it ends.
func (c *Core) progress(out []Action, in Progress) []Action {
	j := c.jobs[in.Job]
	if j == nil || j.State != pb.JobState_JOB_STATE_RUNNING || in.Generation != j.Generation ||
		in.Rank < 0 || in.Rank >= len(j.Members) || j.Members[in.Rank] != in.Worker {
		return out
	}
	j.steps[in.Rank] = in.Step
	if o, ended := j.rec.Progressed(in.At, j.Generation, len(j.Members), in.Step); ended {
		out = append(out, Recovered{Job: j.ID, Generation: j.Generation, Outcome: o})
	}
	n := len(j.Members)
	if n < 2 {
		return out
	}
	var culprit int
	var delay float64
	switch j.Mode {
	case "ring":
		culprit, delay = RingDelayCulprit(in.Rank, n), in.LeftWait
	case "ps":
		if !in.HasLag {
			return out
		}
		culprit, delay = in.Rank, in.Lag
	default:
		return out
	}
	if !j.stragglers.For(j.Generation, n) {
		j.stragglers = NewStragglers(j.Generation, n)
	}
	begins, ends, median := j.stragglers.Observe(culprit, delay)
	if !begins && !ends {
		return out
	}
	id := j.Members[culprit]
	addr := ""
	if w := c.workers[id]; w != nil {
		addr = w.Address
	}
	return append(out, Straggler{Job: j.ID, Worker: id, Address: addr, Mode: j.Mode, Generation: j.Generation, Rank: culprit,
		Step: in.Step, Delay: delay, Median: median, Ends: ends})
}
