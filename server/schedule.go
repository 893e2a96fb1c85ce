package server

// placement gives a job the workers it runs on, by rank.
type placement struct {
	jobID   string
	workers []string
}

// pendingJob is what the scheduler needs to know of a queued job.
type pendingJob struct {
	id      string
	workers int
}

// schedule is the FIFO gang scheduler: jobs start strictly in submission
// order, each when as many idle workers as it asks for are available; a job
// that does not fit blocks those behind it (no backfilling, so a large job is
// never starved). idle is in the order workers should be picked (the caller
// sorts it, e.g. by connection time). It is a pure function.
func schedule(queue []pendingJob, idle []string) []placement {
	var out []placement
	for _, j := range queue {
		if j.workers > len(idle) {
			break
		}
		out = append(out, placement{jobID: j.id, workers: append([]string(nil), idle[:j.workers]...)})
		idle = idle[j.workers:]
	}
	return out
}
