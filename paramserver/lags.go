package paramserver

import "time"

// arrivalLags measures, step by step, how far each rank's gradient trails
// the first rank's at the parameter server. The zero value is ready; it
// is guarded by jobShard.mu.
type arrivalLags struct {
	at  []time.Time     // when each rank's last frame of the current step arrived
	sum []time.Duration // lags since the last takeLag, by rank
	n   []int
}

// arrived records rank's last gradient frame of a step at now; complete
// says it was the step's last rank, so every rank's arrival is known.
func (l *arrivalLags) arrived(rank, world int, now time.Time, complete bool) {
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

// takeLag returns rank's mean lag per step in seconds since the last call.
func (p *jobShard) takeLag(rank int) (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lags
	if rank >= len(l.n) || l.n[rank] == 0 {
		return 0, false
	}
	mean := l.sum[rank].Seconds() / float64(l.n[rank])
	l.sum[rank], l.n[rank] = 0, 0
	return mean, true
}
