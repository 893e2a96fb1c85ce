package data

import "fmt"

// Sampler splits the indices 0..n-1 of a data set across the ranks of a
// data-parallel job, with the semantics of PyTorch's
// torch.utils.data.DistributedSampler:
//
//   - each epoch, every rank derives the same permutation from seed+epoch
//     (or uses 0..n-1 in order when shuffle is off);
//   - without dropLast the permutation is padded by wrapping around to a
//     multiple of world, so every rank gets ceil(n/world) indices (some
//     examples appear twice in an epoch); with dropLast its tail is cut to a
//     multiple of world, so every rank gets floor(n/world);
//   - rank r takes positions r, r+world, r+2·world, … .
//
// The permutations themselves are gradsync's own (not bit-identical to
// torch.randperm). A Sampler is immutable and safe for concurrent use.
type Sampler struct {
	n, rank, world int
	seed           int64
	shuffle        bool
	dropLast       bool
	perRank        int
}

// NewSampler returns rank's sampler over n examples for a job of world
// ranks. It returns an error if n < 0, world < 1 or rank is not in
// [0, world).
func NewSampler(n, rank, world int, seed int64, shuffle, dropLast bool) (*Sampler, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("data: sampler: n = %d, must be ≥ 0", n)
	case world < 1:
		return nil, fmt.Errorf("data: sampler: world = %d, must be ≥ 1", world)
	case rank < 0 || rank >= world:
		return nil, fmt.Errorf("data: sampler: rank %d out of range [0, %d)", rank, world)
	}
	per := (n + world - 1) / world
	if dropLast {
		per = n / world
	}
	return &Sampler{n: n, rank: rank, world: world, seed: seed, shuffle: shuffle, dropLast: dropLast, perRank: per}, nil
}

// Len returns the number of indices this rank gets per epoch:
// ceil(n/world), or floor(n/world) with dropLast.
func (s *Sampler) Len() int { return s.perRank }

// NumBatches returns the number of batches of at most batch indices per
// epoch, counting a final partial batch. batch < 1 is a bug and panics.
func (s *Sampler) NumBatches(batch int) int {
	if batch < 1 {
		panic(fmt.Sprintf("data: Sampler.NumBatches: batch = %d, must be ≥ 1", batch))
	}
	return (s.perRank + batch - 1) / batch
}

// Epoch returns this rank's indices for the given epoch, in the order to
// visit them; the slice is newly allocated and the caller's to keep.
func (s *Sampler) Epoch(epoch int) []int {
	return s.EpochInto(make([]int, s.perRank), epoch)
}

// EpochInto is Epoch writing into dst, which must have length Len(); it
// returns dst. It allocates only when shuffling (the permutation of n).
func (s *Sampler) EpochInto(dst []int, epoch int) []int {
	if len(dst) != s.perRank {
		panic(fmt.Sprintf("data: Sampler.EpochInto: dst has length %d, want %d", len(dst), s.perRank))
	}
	if s.perRank == 0 {
		return dst
	}
	// Position p of the padded or truncated global order maps to
	// order[p mod n]: wrapping around is the padding.
	var order []int
	if s.shuffle {
		order = epochOrder(s.n, s.seed, epoch)
	}
	for j := range dst {
		p := (s.rank + j*s.world) % s.n
		if order != nil {
			p = order[p]
		}
		dst[j] = p
	}
	return dst
}
