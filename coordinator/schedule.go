package coordinator

// Placement gives a job the workers it runs on, by rank.
type Placement struct {
	Job     string
	Workers []string
}

// Pending is what the scheduler needs to know of a queued job.
type Pending struct {
	Job     string
	Workers int
}

// Schedule is the FIFO gang scheduler: jobs start strictly in submission
// order, each when as many idle workers as it asks for are available; a
// job that does not fit blocks those behind it (no backfilling, so a
// large job is never starved). idle is in the order workers should be
// picked (the caller sorts it, e.g. by connection time).
func Schedule(queue []Pending, idle []string) []Placement {
	var out []Placement
	for _, j := range queue {
		if j.Workers > len(idle) {
			break
		}
		out = append(out, Placement{Job: j.Job, Workers: append([]string(nil), idle[:j.Workers]...)})
		idle = idle[j.Workers:]
	}
	return out
}
