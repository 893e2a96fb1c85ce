package federated

import (
	"errors"
	"fmt"
	"math"
)

// Update is one client's answer for one round.
//
// Delta is the client's parameters after local training minus the global
// parameters it started from, a flat buffer in the model's parameter layout
// (models.Network.Params). It is a step in the descent direction: the server
// moves the global model by (a combination of) the deltas, never against
// them. Who owns Delta is stated by each function that takes an Update.
type Update struct {
	Client int // client ID in [0, K)
	Round  int // the round the client trained for
	// Delta has length P, the number of model parameters.
	Delta []float32
	// NumExamples is how many local examples the client trained on (its
	// data set size, not examples × epochs); ≥ 0.
	NumExamples int
	// LabelHist is optional: the number of local examples of each class
	// (length = number of classes). When present it must sum to
	// NumExamples — or, with MultiLabel (an example carries a set of
	// classes, counted once in each), each count is at most NumExamples.
	// WeightLabelBalanced needs it.
	LabelHist  []int
	MultiLabel bool
	// TrainLoss is the client's mean training loss over its last local
	// epoch (informational; NaN or 0 when unknown).
	TrainLoss float64
}

// InvalidUpdateError is an update that can never be accepted: wrong shape,
// non-finite values, inconsistent counts. The gRPC layer maps it to
// codes.InvalidArgument.
type InvalidUpdateError struct {
	Client int
	Reason string
}

func (e *InvalidUpdateError) Error() string {
	return fmt.Sprintf("federated: invalid update from client %d: %s", e.Client, e.Reason)
}

// ErrNoUpdates and ErrNoExamples are rounds that cannot be aggregated.
var (
	ErrNoUpdates  = errors.New("federated: no client updates to aggregate")
	ErrNoExamples = errors.New("federated: the updates hold 0 training examples in total")
)

// check reports why u cannot be aggregated with a P-parameter model.
func (u *Update) check(p int) error {
	bad := func(format string, args ...any) error {
		return &InvalidUpdateError{Client: u.Client, Reason: fmt.Sprintf(format, args...)}
	}
	if len(u.Delta) != p {
		return bad("delta has %d values, the model has %d parameters", len(u.Delta), p)
	}
	if u.NumExamples < 0 {
		return bad("num_examples = %d, must be ≥ 0", u.NumExamples)
	}
	if len(u.LabelHist) > 0 {
		sum := 0
		for c, n := range u.LabelHist {
			if n < 0 || (u.MultiLabel && n > u.NumExamples) {
				return bad("label histogram count %d for class %d, must be in [0, num_examples = %d]", n, c, u.NumExamples)
			}
			sum += n
		}
		if !u.MultiLabel && sum != u.NumExamples {
			return bad("label histogram sums to %d but num_examples = %d", sum, u.NumExamples)
		}
	}
	for i, v := range u.Delta {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return bad("delta[%d] = %v is not finite", i, v)
		}
	}
	return nil
}

// Weighting says how much each client's delta counts in the weighted mean
// (the Mean rule; Median and TrimmedMean are unweighted).
type Weighting int

const (
	// WeightExamples weights client k by its example count n_k (FedAvg,
	// McMahan et al. 2017): the aggregate is the update full-batch training
	// on the union of the participants' data would approximate. The default.
	WeightExamples Weighting = iota
	// WeightUniform gives every participant the same weight. It helps when
	// example counts are very unequal (Dirichlet or power-law splits) and
	// the large clients' distributions would otherwise dominate the global
	// model, when fairness across clients matters more than average
	// accuracy, and when reported counts are not trusted (a client cannot
	// buy influence by claiming more examples).
	WeightUniform
	// WeightLabelBalanced is Non-IID reweighting by label: every class
	// present among the round's participants gets the same total weight,
	// shared among the participants in proportion to how many examples of
	// that class each holds. With H_c = Σ_k h_{k,c} over the participants,
	// client k's weight is Σ_c h_{k,c} / H_c. Under Non-IID sampling a
	// round's participants often hold a very skewed label mix (with
	// Dirichlet α = 0.1 a few clients may carry most of one class); example
	// weighting then drags the global model towards the over-represented
	// classes and the model oscillates from round to round. Balancing by
	// label damps that drift. When every participant has the same label
	// mix (IID) it reduces to WeightExamples. Needs every update's
	// LabelHist.
	WeightLabelBalanced
)

// ParseWeighting maps "examples" (or ""), "uniform" and "label-balanced" to
// a Weighting.
func ParseWeighting(s string) (Weighting, error) {
	switch s {
	case "", "examples":
		return WeightExamples, nil
	case "uniform":
		return WeightUniform, nil
	case "label-balanced":
		return WeightLabelBalanced, nil
	}
	return 0, fmt.Errorf("federated: unknown weighting %q (known: examples, uniform, label-balanced)", s)
}

func (w Weighting) String() string {
	switch w {
	case WeightExamples:
		return "examples"
	case WeightUniform:
		return "uniform"
	case WeightLabelBalanced:
		return "label-balanced"
	}
	return fmt.Sprintf("Weighting(%d)", int(w))
}

// weights writes into dst (one per update, in the updates' order) the
// unnormalised weight of each update. Every weight depends only on its own
// update and on order-free sums, so the result does not depend on the
// order of updates.
func (w Weighting) weights(dst []float64, updates []Update) error {
	switch w {
	case WeightExamples:
		for i := range updates {
			dst[i] = float64(updates[i].NumExamples)
		}
	case WeightUniform:
		for i := range updates {
			dst[i] = 1
		}
	case WeightLabelBalanced:
		classes := len(updates[0].LabelHist)
		for _, u := range updates {
			if len(u.LabelHist) == 0 {
				return &InvalidUpdateError{Client: u.Client, Reason: "label-balanced weighting needs a label histogram"}
			}
			if len(u.LabelHist) != classes {
				return &InvalidUpdateError{Client: u.Client, Reason: fmt.Sprintf("label histogram has %d classes, client %d's has %d",
					len(u.LabelHist), updates[0].Client, classes)}
			}
		}
		total := make([]int, classes)
		for _, u := range updates {
			for c, n := range u.LabelHist {
				total[c] += n
			}
		}
		for i, u := range updates {
			var s float64
			for c, n := range u.LabelHist {
				if n > 0 {
					s += float64(n) / float64(total[c])
				}
			}
			dst[i] = s
		}
	default:
		return fmt.Errorf("federated: unknown weighting %d", int(w))
	}
	return nil
}
