package data

import "fmt"

// epochOrder is the global order of an epoch over n examples: the
// permutation a shuffling Sampler uses (see Sampler.EpochInto).
func epochOrder(n int, seed int64, epoch int) []int {
	r := newRNG(seed+int64(epoch), streamSampler)
	return r.perm(n)
}

// checkResume panics, with a "data: " prefix, on arguments that are bugs.
func checkResume(fn string, n, consumed, rank, world int) {
	switch {
	case n < 0:
		panic(fmt.Sprintf("data: %s: n = %d, must be ≥ 0", fn, n))
	case consumed < 0:
		panic(fmt.Sprintf("data: %s: consumed = %d, must be ≥ 0", fn, consumed))
	case world < 1:
		panic(fmt.Sprintf("data: %s: world = %d, must be ≥ 1", fn, world))
	case rank < 0 || rank >= world:
		panic(fmt.Sprintf("data: %s: rank %d out of range [0, %d)", fn, rank, world))
	}
}

// ResumeLen returns how many indices ResumeSampler gives rank: the
// number of positions p in [consumed, n) with (p−consumed) mod world =
// rank, which is ceil((n−consumed)/world) or one less. consumed ≥ n
// gives 0.
func ResumeLen(n, consumed, rank, world int) int {
	checkResume("ResumeLen", n, consumed, rank, world)
	rest := n - min(consumed, n)
	if rank >= rest {
		return 0
	}
	return (rest-rank-1)/world + 1
}

// ResumeSampler returns rank's indices, in the order to visit them, for
// the rest of the given epoch of a job with world ranks over n examples
// shuffled from seed, when the first consumed positions of the epoch's
// global order have been trained on, by any world size. Together the
// world ranks visit every index not yet consumed exactly once: rank r
// gets remaining positions r, r+world, r+2·world, … (ResumeLen of them).
// consumed ≥ n means the epoch is done, and every rank gets none.
// Negative n or consumed, world < 1 or rank outside [0, world) panic. The
// slice is newly allocated.
//
// # The global order and the sampler position
//
// An epoch's global order is the permutation a shuffling Sampler derives
// from seed+epoch (shuffle on is what the trainer uses; ResumeSampler
// assumes it). Sampler gives rank r of w the global positions r, r+w,
// r+2w, …, so once every rank has trained on its first k indices the
// consumed part of the epoch is exactly the first k·w positions of the
// global order: after S steps of batch b, the first S·b·w. That count,
// clamped to n (positions past n are Sampler's padding), is the sampler
// position a checkpoint records (checkpoint.Meta.EpochConsumed). It does
// not depend on the world size, so an epoch can resume with any other.
//
// ResumeSampler deals positions consumed … n−1 strided over the new ranks
// as Sampler deals a whole epoch, but without padding: no index is seen
// twice, and rank lengths differ by at most one (lower ranks get the
// extra one). Because the new ranks are strided too, after k resumed
// steps of batch b the consumed part is again a prefix of the global
// order, of length min(consumed + k·b·world, n), so a resumed epoch can be
// checkpointed and resumed again with yet another world size.
//
// With consumed = 0, rank r's indices are the first ResumeLen of its
// Sampler.Epoch (which then repeats a few indices as padding), so
// switching the trainer to ResumeSampler changes nothing before a resume
// but that padding.
//
// # The uneven tail
//
// All ranks run ResumeSteps(n, consumed, world, batch) steps in lockstep;
// in step k rank r's batch is its indices [k·batch, min((k+1)·batch,
// len)), which in the last step may be one shorter than another rank's,
// or empty. A rank with an empty batch still takes part in the
// all-reduce, with a zero gradient (what DDP's Join does). To keep the
// step's gradient the mean over the samples actually in it, each rank
// scales its local mean gradient by len(batch)·world/G before the
// all-reduce divides by world, where G = ResumeGlobalBatch(n, consumed,
// world, batch, k) is the step's total batch over all ranks, which every
// rank computes without communicating. Without the scaling the last step
// weights ranks' samples slightly unequally; either way no sample is
// dropped or repeated.
func ResumeSampler(n int, seed int64, epoch int, consumed int, rank, world int) []int {
	checkResume("ResumeSampler", n, consumed, rank, world)
	out := make([]int, ResumeLen(n, consumed, rank, world))
	if len(out) == 0 {
		return out
	}
	order := epochOrder(n, seed, epoch)
	for j := range out {
		out[j] = order[consumed+rank+j*world]
	}
	return out
}

// ResumeSteps returns the number of lockstep steps of at most batch
// indices per rank that finish the epoch from consumed: rank 0's
// (the longest) batch count.
func ResumeSteps(n, consumed, world, batch int) int {
	checkResume("ResumeSteps", n, consumed, 0, world)
	if batch < 1 {
		panic(fmt.Sprintf("data: ResumeSteps: batch = %d, must be ≥ 1", batch))
	}
	return (ResumeLen(n, consumed, 0, world) + batch - 1) / batch
}

// ResumeGlobalBatch returns the total number of indices all world ranks
// train on in resumed step k (0-based): batch·world except in the last
// step, 0 past it. The positions consumed before step k are
// consumed + k·batch·world (up to n).
func ResumeGlobalBatch(n, consumed, world, batch, k int) int {
	checkResume("ResumeGlobalBatch", n, consumed, 0, world)
	if batch < 1 || k < 0 {
		panic(fmt.Sprintf("data: ResumeGlobalBatch: batch = %d, k = %d: want batch ≥ 1, k ≥ 0", batch, k))
	}
	rest := n - min(consumed, n)
	lo := min(k*batch*world, rest)
	return min(lo+batch*world, rest) - lo
}
