package psstep

import "time"

// Lags measures, step by step, how far each rank's push trails the
// first rank's at a consistency-sync shard (the coordinator's straggler
// attribution reads it). Times are passed in. The zero value is ready;
// the caller serialises calls.
type Lags struct {
	at  []time.Time     // when each rank's push of the current step was in
	sum []time.Duration // lags since the last Take, by rank
	n   []int
}

// Arrived records that rank's push of a step was in at now; complete
// says it was the step's last rank's, so every rank's arrival is known
// and each rank's lag behind the first is counted.
func (l *Lags) Arrived(rank, world int, now time.Time, complete bool) {
	if len(l.at) != world {
		l.at, l.sum, l.n = make([]time.Time, world), make([]time.Duration, world), make([]int, world)
	}
	l.at[rank] = now
	if !complete {
		return
	}
	first := l.at[0]
	for _, t := range l.at[1:] {
		if t.Before(first) {
			first = t
		}
	}
	for r, t := range l.at {
		l.sum[r] += t.Sub(first)
		l.n[r]++
	}
}

// Take returns rank's mean lag per step in seconds since the last Take
// of it, and false when no step completed since.
func (l *Lags) Take(rank int) (float64, bool) {
	if rank < 0 || rank >= len(l.n) || l.n[rank] == 0 {
		return 0, false
	}
	mean := l.sum[rank].Seconds() / float64(l.n[rank])
	l.sum[rank], l.n[rank] = 0, 0
	return mean, true
}

// Receipt is what an async or bounded shard answered a rank's push
// with (aggregator.Receipt, and how long the rank's read waited).
type Receipt struct {
	Refused                  bool
	StaleSteps, StaleUpdates int64
	WaitSeconds              float64
}

// Staleness sums a rank's receipts from its async or bounded shards.
// The zero value is ready.
type Staleness struct {
	Receipts                 int64
	StaleSteps, StaleUpdates int64 // sums over the receipts
	MaxSteps, MaxUpdates     int64
	Refused                  int64
	// WaitSeconds sums, per step, the longest wait of any shard.
	WaitSeconds float64
	Steps       int64
}

// Note adds one step's receipts, one per shard that sent one (none with
// consistency sync).
func (s *Staleness) Note(rcs []Receipt) {
	var wait float64
	for _, rc := range rcs {
		s.Receipts++
		s.StaleSteps += rc.StaleSteps
		s.StaleUpdates += rc.StaleUpdates
		s.MaxSteps = max(s.MaxSteps, rc.StaleSteps)
		s.MaxUpdates = max(s.MaxUpdates, rc.StaleUpdates)
		if rc.Refused {
			s.Refused++
		}
		wait = max(wait, rc.WaitSeconds)
	}
	s.WaitSeconds += wait
	s.Steps++
}

// Means are the mean staleness in steps and in updates per receipt;
// false when there was none.
func (s *Staleness) Means() (steps, updates float64, ok bool) {
	if s.Receipts == 0 {
		return 0, 0, false
	}
	n := float64(s.Receipts)
	return float64(s.StaleSteps) / n, float64(s.StaleUpdates) / n, true
}
