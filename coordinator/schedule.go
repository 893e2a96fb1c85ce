package coordinator

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

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
	// Memory is what each rank needs of its worker's memory: rank r
	// needs Memory[r mod len(Memory)] (a pipeline's ranks: rank r holds
	// stage r mod S; one entry: every rank alike). Nil: no need stated.
	Memory []Need
}

// Need is what one rank of a job needs of its worker's memory.
type Need struct {
	Bytes uint64
	// What names what the rank holds, and what the bytes are made of,
	// for messages: "pipeline stage 1 of 4 (blocks.1–head: …)".
	What string
}

// Schedule is the FIFO gang scheduler: jobs start strictly in submission
// order, each when as many idle workers as it asks for are available; a
// job that does not fit blocks those behind it (no backfilling, so a
// large job is never starved). idle is in the order workers should be
// picked (the caller sorts it, e.g. by connection time). runsCommands
// (nil: none does) tells which idle workers may take an entrypoint job.
// memory (nil: no worker reports any) is the memory a worker offers (0:
// not reported, which fits any need): a job with Memory needs goes only
// where each rank's need fits its worker — the first workers in idle's
// order when they fit, else the largest needs on the workers that offer
// most — and blocks the queue while no such choice exists.
func Schedule(queue []Pending, idle []string, runsCommands func(id string) bool, memory func(id string) uint64) []Placement {
	var out []Placement
	idle = slices.Clone(idle)
	for _, j := range queue {
		chosen := fit(j, eligible(j, idle, runsCommands), memory)
		if chosen == nil {
			break
		}
		out = append(out, Placement{Job: j.Job, Workers: chosen})
		idle = slices.DeleteFunc(idle, func(id string) bool { return slices.Contains(chosen, id) })
	}
	return out
}

// eligible is the workers of pool that may take j.
func eligible(j Pending, pool []string, runsCommands func(id string) bool) []string {
	if !j.Entrypoint {
		return pool
	}
	return slices.DeleteFunc(slices.Clone(pool), func(id string) bool { return runsCommands == nil || !runsCommands(id) })
}

// fit picks j's workers, by rank, from pool (in pool's order): the first
// j.Workers when each rank's need fits its worker, else the ranks in
// decreasing need on the workers in decreasing offer (when that fails no
// choice fits: the k-th largest need would need one of the k largest
// offers); nil when none fits or pool is too small.
func fit(j Pending, pool []string, memory func(id string) uint64) []string {
	n := j.Workers
	if n > len(pool) {
		return nil
	}
	need, offer := needs(j), offers(memory)
	first := pool[:n]
	fits := true
	for r, id := range first {
		fits = fits && need(r).Bytes <= offer(id)
	}
	if fits {
		return slices.Clone(first)
	}
	ranks, ws := byNeed(n, need), byOffer(pool, offer)
	chosen := make([]string, n)
	for i, r := range ranks {
		if need(r).Bytes > offer(ws[i]) {
			return nil
		}
		chosen[r] = ws[i]
	}
	return chosen
}

func needs(j Pending) func(r int) Need {
	return func(r int) Need {
		if len(j.Memory) == 0 {
			return Need{}
		}
		return j.Memory[r%len(j.Memory)]
	}
}

// offers is what each worker offers; not reported (0, or no memory
// function) fits anything.
func offers(memory func(id string) uint64) func(id string) uint64 {
	return func(id string) uint64 {
		if memory == nil {
			return math.MaxUint64
		}
		if m := memory(id); m > 0 {
			return m
		}
		return math.MaxUint64
	}
}

// byNeed is the ranks 0…n−1 in decreasing need (stable).
func byNeed(n int, need func(int) Need) []int {
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	slices.SortStableFunc(ranks, func(a, b int) int { return cmpDesc(need(a).Bytes, need(b).Bytes) })
	return ranks
}

// byOffer is ids in decreasing offer (stable).
func byOffer(ids []string, offer func(string) uint64) []string {
	ws := slices.Clone(ids)
	slices.SortStableFunc(ws, func(a, b string) int { return cmpDesc(offer(a), offer(b)) })
	return ws
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// Unplaceable says why j can never be placed on the workers of pool (the
// connected ones, idle or busy): the rank whose need no worker left can
// meet, and what every worker offers. It is "" when j fits, and when pool
// has too few workers for it to tell (the job waits for more).
func Unplaceable(j Pending, pool []string, runsCommands func(id string) bool, memory func(id string) uint64) string {
	pool = eligible(j, pool, runsCommands)
	if j.Workers > len(pool) || fit(j, pool, memory) != nil {
		return ""
	}
	need, offer := needs(j), offers(memory)
	ranks, ws := byNeed(j.Workers, need), byOffer(pool, offer)
	for i, r := range ranks {
		if need(r).Bytes <= offer(ws[i]) {
			continue
		}
		var of []string
		for _, id := range ws {
			if m := offer(id); m == math.MaxUint64 {
				of = append(of, id+" not reported")
			} else {
				of = append(of, id+" "+Bytes(m))
			}
		}
		where := "the largest worker offers"
		if i > 0 {
			where = fmt.Sprintf("the workers left after %d larger needs offer at most", i)
		}
		return fmt.Sprintf("cannot be placed: rank %d holds %s, which needs %s of memory, but %s %s (workers' memory: %s)",
			r, need(r).What, Bytes(need(r).Bytes), where, Bytes(offer(ws[i])), strings.Join(of, ", "))
	}
	return ""
}

// Bytes writes n in binary units (KiB, MiB, GiB) with two decimals.
func Bytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, u := float64(n), 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.2f %s", v, units[u])
}
