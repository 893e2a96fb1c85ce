package aggregator

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"
)

// Algorithm names an all-reduce algorithm.
type Algorithm uint8

// All-reduce algorithms. AlgoAuto is resolved by a CostModel.
const (
	AlgoAuto Algorithm = iota
	AlgoRing
	AlgoHalvingDoubling
	AlgoTree
)

// Algorithms are the runnable algorithms, in the order estimates are listed.
var Algorithms = []Algorithm{AlgoRing, AlgoHalvingDoubling, AlgoTree}

func (a Algorithm) String() string {
	switch a {
	case AlgoAuto:
		return "auto"
	case AlgoRing:
		return "ring"
	case AlgoHalvingDoubling:
		return "halving_doubling"
	case AlgoTree:
		return "tree"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// AlgorithmNames are the accepted spellings of ParseAlgorithm.
var AlgorithmNames = []string{"auto", "ring", "halving_doubling", "tree"}

// ParseAlgorithm parses one of AlgorithmNames; "" is auto.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return AlgoAuto, nil
	case "ring":
		return AlgoRing, nil
	case "halving_doubling", "halving-doubling", "hd":
		return AlgoHalvingDoubling, nil
	case "tree":
		return AlgoTree, nil
	}
	return AlgoAuto, fmt.Errorf("unknown all-reduce algorithm %q; allowed: %s", s, strings.Join(AlgorithmNames, ", "))
}

// CostModel is the α–β model of an all-reduce: a message of b bytes over
// one link takes Alpha + b·Beta. The zero value is not usable; take one of
// the per-transport constants (CostMem, CostSHM, CostGRPC) or fit one with
// FitCost. The model counts messages and bytes on the critical path of
// each algorithm's schedule as this package runs it (frames of at most
// MaxFrameElems, pipelined), not of an idealised one.
type CostModel struct {
	// Alpha is the latency of one message (frame), including the
	// per-frame work of both ends.
	Alpha time.Duration
	// Beta is the time per KiB of one link (1 KiB / bandwidth): per KiB
	// rather than per byte because a nanosecond per byte is already a
	// slow link (1 GB/s). PerByte gives seconds per byte.
	Beta time.Duration
	// Cores, if positive, is how many cores the ranks share (ranks that
	// are goroutines of one process: runtime.GOMAXPROCS); 0 means every
	// rank has cores of its own. A step in which more ranks are busy
	// than there are cores takes active/Cores times as long, so an
	// algorithm that keeps fewer ranks busy at a time (halving-doubling's
	// fold involves two ranks per pair; the ring keeps all n busy every
	// step) pays less.
	Cores int
}

// betaScale makes CostModel.Beta a Duration per KiB.
const betaScale = 1024

// PerByte returns Beta in seconds per byte.
func (m CostModel) PerByte() float64 { return m.Beta.Seconds() / betaScale }

// Per-transport constants, from aggregator.Calibrate's probes on the
// development machine (2 shared cores, load ≈ 6–7; see
// docs/experiments/collectives/): in memory α ≈ 0.53–0.55 µs, β ≈
// 0.033–0.041 µs/KiB; two-rank shared-memory rings α ≈ 8.6–10.4 µs, β ≈
// 0.077–0.099 µs/KiB. CostGRPC is NOT calibrated that way (the gRPC
// transport has no Peers yet, so only the ring runs on it and nothing
// picks with it); it is a rough figure from ring runs, used only to label
// the process transports' lines.
var (
	CostMem  = CostModel{Alpha: 550 * time.Nanosecond, Beta: 38 * time.Nanosecond}
	CostSHM  = CostModel{Alpha: 9500 * time.Nanosecond, Beta: 90 * time.Nanosecond}
	CostGRPC = CostModel{Alpha: 60 * time.Microsecond, Beta: 2 * time.Microsecond}
)

// Estimate is a model's predicted time for one algorithm.
type Estimate struct {
	Algo Algorithm
	Time time.Duration
}

// Estimate predicts the time of algorithm a for an all-reduce of elems
// float32 values over n ranks with frames of at most frameElems values
// (0: DefaultMaxFrameElems).
func (m CostModel) Estimate(a Algorithm, n, elems, frameElems int) time.Duration {
	if frameElems == 0 {
		frameElems = DefaultMaxFrameElems
	}
	if n <= 1 || elems == 0 {
		return 0
	}
	alpha, beta := m.Alpha.Seconds(), m.PerByte()
	// msg is the time to send size elements as frames one after another.
	msg := func(size int) float64 {
		if size == 0 {
			return 0
		}
		return float64(nframes(size, frameElems))*alpha + 4*float64(size)*beta
	}
	// share is how much longer a step takes with active ranks busy.
	share := func(active int) float64 {
		if m.Cores <= 0 || active <= m.Cores {
			return 1
		}
		return float64(active) / float64(m.Cores)
	}
	var t float64
	switch a {
	case AlgoRing:
		// 2(n−1) steps of a chunk each; frames of one step pipeline into
		// the next, so the critical path is 2(n−1) first frames plus the
		// rest of the chunk once. Every rank is busy in every step.
		chunk := (elems + n - 1) / n
		first := min(chunk, frameElems)
		t = share(n) * (float64(2*(n-1))*msg(first) + msg(chunk) - msg(first))
	case AlgoHalvingDoubling:
		q := 1 << (bits.Len(uint(n)) - 1)
		if n > q {
			t += 2 * msg(elems) * share(2*(n-q)) // fold and unfold: the 2(n−q) ranks of the extra pairs
		}
		busy := share(q) // the q ranks left after the fold
		for size := elems / 2; q > 1; q /= 2 {
			t += 2 * msg(max(size, 1)) * busy // a halving step and its doubling step
			size /= 2
		}
	case AlgoTree:
		depth := bits.Len(uint(n)) - 1
		f := min(elems, frameElems)
		// Up and down the tree: depth levels, each a node handling two
		// children's frames in turn, then the rest of the buffer behind
		// the first frame at the root's pace; pipelined, every rank busy.
		t = share(n) * 2 * (float64(depth)*2*msg(f) + 2*(msg(elems)-msg(f)))
	default:
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(t * 1e9)
}

// Choose returns the algorithm with the smallest estimate for elems
// float32 values over n ranks, and every runnable algorithm's estimate
// (in the order of Algorithms), so that callers can log why. Ties go to
// the earlier algorithm (the ring first). A world of one rank, or an
// empty buffer, is the ring (nothing is sent).
func (m CostModel) Choose(n, elems, frameElems int) (Algorithm, []Estimate) {
	est := make([]Estimate, 0, len(Algorithms))
	best := AlgoRing
	var bestT time.Duration = -1
	for _, a := range Algorithms {
		t := m.Estimate(a, n, elems, frameElems)
		est = append(est, Estimate{a, t})
		if bestT < 0 || t < bestT {
			best, bestT = a, t
		}
	}
	return best, est
}

// FitCost fits α and β to measured point-to-point times: bytes[i] took
// took[i] one way. It is a least-squares line through the points; with
// fewer than two distinct sizes it returns an error.
func FitCost(bytes []int, took []time.Duration) (CostModel, error) {
	if len(bytes) != len(took) || len(bytes) < 2 {
		return CostModel{}, fmt.Errorf("aggregator: FitCost: want at least two (bytes, time) pairs, got %d and %d", len(bytes), len(took))
	}
	var sx, sy, sxx, sxy float64
	for i := range bytes {
		x, y := float64(bytes[i]), took[i].Seconds()
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	k := float64(len(bytes))
	den := k*sxx - sx*sx
	if den == 0 {
		return CostModel{}, fmt.Errorf("aggregator: FitCost: all %d probes have the same size", len(bytes))
	}
	beta := (k*sxy - sx*sy) / den
	alpha := (sy - beta*sx) / k
	return CostModel{
		Alpha: time.Duration(max(alpha, 0) * 1e9),
		Beta:  time.Duration(max(beta, 0) * 1e9 * betaScale),
	}, nil
}
