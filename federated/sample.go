package federated

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// NumSampled is the number of clients per round, max(1, round(C·K)), for K
// clients and fraction C ∈ [0, 1]. C = 0 means one client per round
// (McMahan et al. 2017's C = 0).
func NumSampled(clients int, fraction float64) (int, error) {
	if clients < 1 {
		return 0, fmt.Errorf("federated: %d clients, need ≥ 1", clients)
	}
	if !(fraction >= 0 && fraction <= 1) {
		return 0, fmt.Errorf("federated: client fraction C = %v, must be in [0, 1]", fraction)
	}
	return max(1, int(math.Round(fraction*float64(clients)))), nil
}

// SampleClients draws the clients of one round: NumSampled(clients,
// fraction) distinct IDs in [0, clients), uniformly without replacement,
// returned in ascending order in a new slice. The draw is a pure function
// of (seed, round): every replica of the server, and a rerun, picks the
// same clients; different rounds draw independently.
func SampleClients(clients int, fraction float64, seed int64, round int) ([]int, error) {
	m, err := NumSampled(clients, fraction)
	if err != nil {
		return nil, err
	}
	r := newRand(seed, streamSample, uint64(round))
	// Partial Fisher–Yates: the first m positions are a uniform m-subset.
	ids := make([]int, clients)
	for i := range ids {
		ids[i] = i
	}
	for i := range m {
		j := i + r.IntN(clients-i)
		ids[i], ids[j] = ids[j], ids[i]
	}
	out := slices.Clone(ids[:m])
	slices.Sort(out)
	return out, nil
}

// Random streams: different uses of one seed draw independent numbers.
const (
	streamSample uint64 = iota + 1
	streamShuffle
	streamStraggler
)

// newRand returns a generator that is a pure function of seed, the stream
// and the keys (round, client, epoch, …), each mixed in through splitmix64
// so that neighbouring keys give unrelated streams. math/rand/v2's PCG and
// IntN/Float64 are used: their outputs may change between Go releases, so
// runs are reproducible for one toolchain.
func newRand(seed int64, stream uint64, keys ...uint64) *rand.Rand {
	s := splitmix64(uint64(seed) ^ splitmix64(stream))
	for _, k := range keys {
		s = splitmix64(s ^ splitmix64(k))
	}
	return rand.New(rand.NewPCG(s, splitmix64(s)))
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
