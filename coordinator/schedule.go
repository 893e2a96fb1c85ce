package coordinator

import "slices"

// Placement gives a job the workers it runs on, by rank.
type Placement struct {
	Job     string
	Workers []string
}

// Pending is what the scheduler needs to know of a queued job.
type Pending struct {
	Job     string
	Workers int
	// Entrypoint: the job runs a user's command, so only workers that run
	// commands (started with --allow-entrypoints) may take it.
	Entrypoint bool
}

// Schedule is the FIFO gang scheduler: jobs start strictly in submission
// order, each when as many idle workers as it asks for are available; a
// job that does not fit blocks those behind it (no backfilling, so a
// large job is never starved). idle is in the order workers should be
// picked (the caller sorts it, e.g. by connection time). runsCommands
// (nil: none does) tells which idle workers may take an entrypoint job.
func Schedule(queue []Pending, idle []string, runsCommands func(id string) bool) []Placement {
	var out []Placement
	idle = slices.Clone(idle)
	for _, j := range queue {
		pool := idle
		if j.Entrypoint {
			pool = slices.DeleteFunc(slices.Clone(idle), func(id string) bool { return runsCommands == nil || !runsCommands(id) })
		}
		if j.Workers > len(pool) {
			break
		}
		chosen := slices.Clone(pool[:j.Workers])
		out = append(out, Placement{Job: j.Job, Workers: chosen})
		idle = slices.DeleteFunc(idle, func(id string) bool { return slices.Contains(chosen, id) })
	}
	return out
}
