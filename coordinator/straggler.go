package coordinator

import (
	"slices"
	"time"
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
