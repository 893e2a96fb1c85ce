package coordinator

import (
	"slices"
)

// The new generation of an elastic job respects what its workers offer
// of their memory (a joiner must hold what its rank needs), and an
// elastic pipeline job's (stages > 1) runs on whole replicas: a multiple
// of the stages, with a survivor placed, where it can be, on the stage it
// held (pipeline.Place's mesh: rank r holds stage r mod S), so that its
// in-memory snapshot is of the stage it goes on with.

// planGeneration picks the workers of j's new generation after the loss
// of lost ("" for growth): Recovery.Plan's choice for a ring job (among
// the idle workers that offer what a rank needs), and PlanStages' for a
// pipeline job.
func (c *Core) planGeneration(j *Job, lost string, grow bool) ([]string, bool) {
	survivors := c.survivors(j, lost)
	if j.stages <= 1 {
		idle := slices.DeleteFunc(c.Idle(), func(id string) bool { return !c.fits(j, id, 0) })
		return j.rec.Plan(survivors, idle, j.size, j.min, grow)
	}
	held := map[string]int{}
	for r, id := range j.Members {
		held[id] = r % j.stages
	}
	return j.rec.PlanStages(survivors, c.Idle(), j.size, j.min, j.stages, grow, held, func(id string, rank int) bool { return c.fits(j, id, rank) })
}

// fits reports whether worker id may hold rank rank of j: it runs
// commands if j runs one, and it offers what the rank needs of its
// memory (a worker that reports none, or a job that states no need,
// fits).
func (c *Core) fits(j *Job, id string, rank int) bool {
	w := c.workers[id]
	if j.entrypoint && w != nil && !w.Resources.GetAllowsEntrypoints() {
		return false
	}
	if len(j.memory) == 0 {
		return true
	}
	return w == nil || w.Memory == 0 || j.memory[rank%len(j.memory)].Bytes <= w.Memory
}

// PlanStages is Plan for a pipeline job of stages stages: the survivors,
// then idle workers in the order given (never an evicted one), on the
// largest multiple of stages up to size for which every rank r gets a
// worker that fits it (fits(id, r); nil: any fits): rank r (stage r mod
// stages) goes to a survivor that held that stage (held: worker → stage)
// where one is left, else to the next worker of that order. It refuses
// fewer than least workers, and for growth a generation no larger than
// the survivors.
func (r *Recovery) PlanStages(survivors, idle []string, size, least, stages int, grow bool, held map[string]int, fits func(id string, rank int) bool) ([]string, bool) {
	if fits == nil {
		fits = func(string, int) bool { return true }
	}
	pool := append([]string(nil), survivors...)
	for _, id := range idle {
		if !r.evicted[id] && !slices.Contains(pool, id) {
			pool = append(pool, id)
		}
	}
	for n := min(size, len(pool)) / stages * stages; n >= max(least, 1) && !(grow && n <= len(survivors)); n -= stages {
		if ids := arrange(n, stages, survivors, pool, held, fits); ids != nil {
			return ids, true
		}
	}
	return nil, false
}

// arrange fills n ranks from pool (see PlanStages), or returns nil when
// some rank finds no worker that fits it.
func arrange(n, stages int, survivors, pool []string, held map[string]int, fits func(string, int) bool) []string {
	ids := make([]string, n)
	used := map[string]bool{}
	for rank := range ids {
		for _, id := range survivors {
			if s, ok := held[id]; ok && s == rank%stages && !used[id] && fits(id, rank) {
				ids[rank], used[id] = id, true
				break
			}
		}
	}
	for rank := range ids {
		if ids[rank] != "" {
			continue
		}
		for _, id := range pool {
			if !used[id] && fits(id, rank) {
				ids[rank], used[id] = id, true
				break
			}
		}
		if ids[rank] == "" {
			return nil
		}
	}
	return ids
}
