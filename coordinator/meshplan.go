package coordinator

import "slices"

// The new generation of an elastic pipeline job (stages > 1): its
// workers hold whole replicas of the stages, so a generation runs on a
// multiple of the stages, and a survivor is placed, where it can be, on
// the stage it held (pipeline.Place's mesh: rank r holds stage r mod S),
// so that its in-memory snapshot is of the stage it goes on with.

// planGeneration picks the workers of j's new generation after the loss
// of lost ("" for growth): Recovery.Plan's choice for a ring job, and
// PlanStages' for a pipeline job.
func (c *Core) planGeneration(j *Job, lost string, grow bool) ([]string, bool) {
	survivors := c.survivors(j, lost)
	if j.stages <= 1 {
		return j.rec.Plan(survivors, c.Idle(), j.size, j.min, grow)
	}
	held := map[string]int{}
	for r, id := range j.Members {
		held[id] = r % j.stages
	}
	return j.rec.PlanStages(survivors, c.Idle(), j.size, j.min, j.stages, grow, held)
}

// PlanStages is Plan for a pipeline job of stages stages: the survivors,
// then idle workers in the order given (never an evicted one), cut to the
// largest multiple of stages up to size, and arranged so that rank r
// (stage r mod stages) goes to a survivor that held that stage (held:
// worker → stage) where one is left, else to the next worker chosen. It
// refuses fewer than least workers, and for growth a generation no larger
// than the survivors.
func (r *Recovery) PlanStages(survivors, idle []string, size, least, stages int, grow bool, held map[string]int) ([]string, bool) {
	pool := append([]string(nil), survivors...)
	for _, id := range idle {
		if !r.evicted[id] && !slices.Contains(pool, id) {
			pool = append(pool, id)
		}
	}
	n := min(size, len(pool)) / stages * stages
	if n < least || n == 0 || (grow && n <= len(survivors)) {
		return nil, false
	}
	ids := make([]string, n)
	used := map[string]bool{}
	for rank := range ids {
		for _, id := range survivors {
			if s, ok := held[id]; ok && s == rank%stages && !used[id] {
				ids[rank], used[id] = id, true
				break
			}
		}
	}
	next := 0
	for rank := range ids {
		if ids[rank] != "" {
			continue
		}
		for used[pool[next]] {
			next++
		}
		ids[rank], used[pool[next]] = pool[next], true
	}
	return ids, true
}
