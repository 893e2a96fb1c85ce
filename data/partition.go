package data

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// The partitioners split a data set's examples across federated clients.
// Each is a pure function of its arguments: every index in 0..len(labels)-1
// is assigned to exactly one client, the same seed gives the same
// partition, and each client's indices are returned in ascending order
// (shuffle them per epoch when training).

// PartitionIID deals the examples to clients uniformly at random: client
// sizes differ by at most one and each client's label mix follows the data
// set's. clients < 1 is a bug and panics.
func PartitionIID(labels []int32, clients int, seed int64) [][]int {
	return PartitionIIDN(len(labels), clients, seed)
}

// PartitionIIDN is [PartitionIID] of n examples, whatever their labels
// (a multi-label set's too).
func PartitionIIDN(n, clients int, seed int64) [][]int {
	if clients < 1 {
		panic(fmt.Sprintf("data: PartitionIID: clients = %d, must be ≥ 1", clients))
	}
	r := newRNG(seed, streamIID)
	perm := r.perm(n)
	out := make([][]int, clients)
	for c := range out {
		lo, hi := evenCut(len(perm), clients, c)
		out[c] = sorted(perm[lo:hi])
	}
	return out
}

// PartitionDirichlet gives each client a label distribution drawn from a
// symmetric Dirichlet(α): for every class, the class's examples (in random
// order) are split among the clients in proportions drawn from
// Dirichlet(α, …, α) (Hsu et al. 2019). Small α (0.1) gives each client few
// classes; large α (100) approaches IID. Clients may receive no examples
// when α is small. Labels must be in [0, classes).
func PartitionDirichlet(labels []int32, classes, clients int, alpha float64, seed int64) ([][]int, error) {
	if err := checkPartition("PartitionDirichlet", labels, classes, clients); err != nil {
		return nil, err
	}
	if !(alpha > 0) || math.IsInf(alpha, 0) {
		return nil, fmt.Errorf("data: PartitionDirichlet: alpha = %v, must be positive and finite", alpha)
	}
	r := newRNG(seed, streamDirichlet)
	byClass := indicesByClass(labels, classes)
	out := make([][]int, clients)
	props := make([]float64, clients)
	counts := make([]int, clients)
	for _, idx := range byClass {
		shuffle(&r, idx)
		r.dirichlet(props, alpha)
		apportion(counts, props, len(idx))
		off := 0
		for c, k := range counts {
			out[c] = append(out[c], idx[off:off+k]...)
			off += k
		}
	}
	for c := range out {
		out[c] = sorted(out[c])
	}
	return out, nil
}

// PartitionShards is the pathological non-IID split of McMahan et al.
// (2017): the examples, sorted by label, are cut into clients·shardsPerClient
// contiguous shards of equal size (differing by at most one when the count
// does not divide), and each client receives shardsPerClient shards chosen
// at random, so it sees about shardsPerClient classes.
func PartitionShards(labels []int32, clients, shardsPerClient int, seed int64) ([][]int, error) {
	if clients < 1 {
		return nil, fmt.Errorf("data: PartitionShards: clients = %d, must be ≥ 1", clients)
	}
	if shardsPerClient < 1 {
		return nil, fmt.Errorf("data: PartitionShards: shardsPerClient = %d, must be ≥ 1", shardsPerClient)
	}
	shards := clients * shardsPerClient
	if shards > len(labels) {
		return nil, fmt.Errorf("data: PartitionShards: %d clients × %d shards = %d shards, more than the %d examples",
			clients, shardsPerClient, shards, len(labels))
	}
	order := make([]int, len(labels))
	for i := range order {
		order[i] = i
	}
	// Stable: equal labels keep index order, so the cut does not depend on
	// the sort algorithm.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(labels[a], labels[b]) })
	r := newRNG(seed, streamShards)
	perm := r.perm(shards)
	out := make([][]int, clients)
	for c := range out {
		for _, s := range perm[c*shardsPerClient : (c+1)*shardsPerClient] {
			lo, hi := evenCut(len(order), shards, s)
			out[c] = append(out[c], order[lo:hi]...)
		}
		out[c] = sorted(out[c])
	}
	return out, nil
}

// PartitionLabel gives clients disjoint label groups. The classes, in a
// random order, are dealt to clients: with clients ≤ classes each client owns
// a group of whole classes (group sizes differ by at most one); with more
// clients than classes, each class is owned by a group of clients
// (sizes differing by at most one) that split its examples evenly at random.
// Either way no label is shared between clients of different groups.
// Labels must be in [0, classes).
func PartitionLabel(labels []int32, classes, clients int, seed int64) ([][]int, error) {
	if err := checkPartition("PartitionLabel", labels, classes, clients); err != nil {
		return nil, err
	}
	r := newRNG(seed, streamLabel)
	byClass := indicesByClass(labels, classes)
	classOrder := r.perm(classes)
	out := make([][]int, clients)
	if clients <= classes {
		for c := range out {
			lo, hi := evenCut(classes, clients, c)
			for _, k := range classOrder[lo:hi] {
				out[c] = append(out[c], byClass[k]...)
			}
			out[c] = sorted(out[c])
		}
		return out, nil
	}
	for g, k := range classOrder {
		lo, hi := evenCut(clients, classes, g) // clients lo..hi-1 own class k
		idx := byClass[k]
		shuffle(&r, idx)
		for c := lo; c < hi; c++ {
			a, b := evenCut(len(idx), hi-lo, c-lo)
			out[c] = sorted(idx[a:b])
		}
	}
	return out, nil
}

// Histogram returns the number of examples of each class among labels[idx].
// A label ≥ classes or an index out of range is a bug and panics.
func Histogram(labels []int32, idx []int, classes int) []int {
	h := make([]int, classes)
	for _, i := range idx {
		l := int(labels[i])
		if l < 0 || l >= classes {
			panic(fmt.Sprintf("data: Histogram: label %d at index %d out of range [0, %d)", l, i, classes))
		}
		h[l]++
	}
	return h
}

// MaxPartitionClasses bounds the label spaces the partitioners take (as
// jobspec.MaxClasses bounds a data set's).
const MaxPartitionClasses = 1 << 20

func checkPartition(fn string, labels []int32, classes, clients int) error {
	if classes < 1 || classes > MaxPartitionClasses {
		return fmt.Errorf("data: %s: classes = %d, must be in [1, %d]", fn, classes, MaxPartitionClasses)
	}
	if clients < 1 {
		return fmt.Errorf("data: %s: clients = %d, must be ≥ 1", fn, clients)
	}
	for i, l := range labels {
		if l < 0 || int(l) >= classes {
			return fmt.Errorf("data: %s: label %d at index %d out of range [0, %d)", fn, l, i, classes)
		}
	}
	return nil
}

// indicesByClass returns, for each class, the indices with that label in
// ascending order.
func indicesByClass(labels []int32, classes int) [][]int {
	h := make([]int, classes)
	for _, l := range labels {
		h[l]++
	}
	out := make([][]int, classes)
	for k := range out {
		out[k] = make([]int, 0, h[k])
	}
	for i, l := range labels {
		out[l] = append(out[l], i)
	}
	return out
}

// evenCut returns part i of n items cut into parts parts whose sizes differ
// by at most one (the first n mod parts parts are one larger).
func evenCut(n, parts, i int) (lo, hi int) {
	q, r := n/parts, n%parts
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}

// apportion sets counts to non-negative integers summing to total, in
// proportion to props (which sum to 1), by largest remainder; ties go to the
// lower index so the result is deterministic.
func apportion(counts []int, props []float64, total int) {
	type rem struct {
		frac float64
		i    int
	}
	rems := make([]rem, len(counts))
	left := total
	for i, p := range props {
		exact := p * float64(total)
		counts[i] = int(math.Floor(exact))
		rems[i] = rem{exact - float64(counts[i]), i}
		left -= counts[i]
	}
	slices.SortFunc(rems, func(a, b rem) int {
		if c := cmp.Compare(b.frac, a.frac); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	})
	// Floating error can leave left outside [0, len); clamp by cycling.
	for j := 0; left > 0; j = (j + 1) % len(rems) {
		counts[rems[j].i]++
		left--
	}
	for j := len(rems) - 1; left < 0; j = (j - 1 + len(rems)) % len(rems) {
		if counts[rems[j].i] > 0 {
			counts[rems[j].i]--
			left++
		}
	}
}

// sorted returns an ascending copy of s.
func sorted(s []int) []int {
	out := slices.Clone(s)
	if out == nil {
		out = []int{}
	}
	slices.Sort(out)
	return out
}
