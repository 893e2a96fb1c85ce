package aggregator

import "fmt"

// Range is the half-open element range [Lo, Hi) of the flat parameter
// vector that one parameter-server shard owns.
type Range struct{ Lo, Hi int }

// Len is the number of elements in r.
func (r Range) Len() int { return r.Hi - r.Lo }

// Partition splits a flat vector of n elements into k contiguous ranges,
// in order, balanced by element count: the first n%k ranges hold
// n/k+1 elements, the others n/k. Ranges ignore layer boundaries on
// purpose: the optimisers a shard runs are elementwise, so where a cut
// falls changes nothing but the load, and equal counts balance it best
// (a layer may be split across two shards). With k > n the last k-n
// ranges are empty. Every process of a job (server, aggregators,
// workers) computes the same ranges from (n, k).
func Partition(n, k int) []Range {
	if n < 0 || k < 1 {
		panic(fmt.Sprintf("aggregator: Partition(%d, %d): want n ≥ 0 and k ≥ 1", n, k))
	}
	out := make([]Range, k)
	q, r := n/k, n%k
	lo := 0
	for i := range out {
		size := q
		if i < r {
			size++
		}
		out[i] = Range{Lo: lo, Hi: lo + size}
		lo += size
	}
	return out
}
