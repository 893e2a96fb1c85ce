package federated

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Strategy is the server's aggregation step (Flower's strategy idea): a
// weighting, a rule that combines the weighted client deltas into one
// pseudo-gradient Δ, and a server optimiser that moves the global model by
// Δ. A Strategy holds optimiser state across rounds and scratch buffers; it
// is not safe for concurrent use.
type Strategy struct {
	Name      string // as given to NewStrategy, for logs
	Weighting Weighting
	Rule      Rule
	Server    ServerOptimizer

	w     []float64 // scratch: per-update weights
	delta []float32 // scratch: the combined delta, length P
}

// StrategyConfig selects and tunes a Strategy. The zero value is FedAvg
// weighted by example count.
type StrategyConfig struct {
	// Name is one of FederatedSpec.strategy's values:
	//
	//	fedavg (default)  weighted mean, x ← x + Δ
	//	fedprox           as fedavg on the server; the clients add the
	//	                  proximal term (AddProximal) with μ
	//	fedavgm           weighted mean, server momentum (ServerMomentum)
	//	fedadam, fedyogi  weighted mean, adaptive server step (Adaptive)
	//	median            coordinate-wise median, x ← x + ServerLR·Δ
	//	trimmed-mean      coordinate-wise trimmed mean, x ← x + ServerLR·Δ
	Name string
	// Weighting of the mean rules; ignored by median and trimmed-mean.
	Weighting Weighting
	// ServerLR is η; 0 means the strategy's default (1 for fedavg,
	// fedprox, median and trimmed-mean; 0.1 for fedavgm; 0.01 for fedadam
	// and fedyogi).
	ServerLR float64
	// ServerMomentum is fedavgm's β; 0 means 0.9.
	ServerMomentum float64
	// Beta1, Beta2 and Tau tune fedadam and fedyogi; 0 means 0.9, 0.99 and
	// 1e-3.
	Beta1, Beta2, Tau float64
	// TrimFraction is trimmed-mean's β, the fraction dropped at each end;
	// 0 means 0.1.
	TrimFraction float64
}

// NewStrategy builds the strategy cfg names.
func NewStrategy(cfg StrategyConfig) (*Strategy, error) {
	if cfg.ServerLR < 0 || cfg.ServerMomentum < 0 || cfg.ServerMomentum >= 1 ||
		cfg.Beta1 < 0 || cfg.Beta1 >= 1 || cfg.Beta2 < 0 || cfg.Beta2 >= 1 || cfg.Tau < 0 {
		return nil, fmt.Errorf("federated: strategy %q: need ServerLR ≥ 0, ServerMomentum, Beta1, Beta2 in [0, 1) and Tau ≥ 0, got %+v", cfg.Name, cfg)
	}
	if cfg.TrimFraction < 0 || cfg.TrimFraction >= 0.5 {
		return nil, fmt.Errorf("federated: strategy %q: trim fraction %v, must be in [0, 0.5)", cfg.Name, cfg.TrimFraction)
	}
	if cfg.Weighting < WeightExamples || cfg.Weighting > WeightLabelBalanced {
		return nil, fmt.Errorf("federated: strategy %q: unknown weighting %d", cfg.Name, int(cfg.Weighting))
	}
	s := &Strategy{Name: cfg.Name, Weighting: cfg.Weighting}
	switch cfg.Name {
	case "", "fedavg", "fedprox":
		if s.Name == "" {
			s.Name = "fedavg"
		}
		s.Rule, s.Server = &Mean{}, &ServerSGD{LR: cfg.ServerLR}
	case "fedavgm":
		s.Rule, s.Server = &Mean{}, &ServerMomentum{LR: cfg.ServerLR, Momentum: cfg.ServerMomentum}
	case "fedadam", "fedyogi":
		s.Rule = &Mean{}
		s.Server = &Adaptive{Yogi: cfg.Name == "fedyogi", LR: cfg.ServerLR, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Tau: cfg.Tau}
	case "median":
		s.Rule, s.Server = &Median{}, &ServerSGD{LR: cfg.ServerLR}
	case "trimmed-mean":
		s.Rule, s.Server = &TrimmedMean{Beta: orDefault(cfg.TrimFraction, 0.1)}, &ServerSGD{LR: cfg.ServerLR}
	default:
		return nil, fmt.Errorf("federated: unknown strategy %q (known: fedavg, fedprox, fedavgm, fedadam, fedyogi, median, trimmed-mean)", cfg.Name)
	}
	return s, nil
}

// Stats describes one aggregation.
type Stats struct {
	Clients       int       // number of updates aggregated
	TotalExamples int       // Σ NumExamples
	Weights       []float64 // normalised weights (sum 1), one per update sorted by Client; the Mean rule's, else uniform
	DeltaNorm     float64   // ‖Δ‖₂ of the combined delta, before the server optimiser
	TrainLoss     float64   // the updates' TrainLoss, example-weighted mean
}

// Aggregate combines updates (one per client, any order, each Delta of
// length len(global)) and steps global in place. The updates and their
// deltas are only read and not kept. The result — global's new bits and
// the optimiser state — does not depend on the order of updates: they are
// processed sorted by Client. Duplicate clients, malformed updates, no
// updates (ErrNoUpdates) and 0 examples in total (ErrNoExamples) are errors,
// and leave global and the optimiser state unchanged.
func (s *Strategy) Aggregate(global []float32, updates []Update) (Stats, error) {
	if len(updates) == 0 {
		return Stats{}, ErrNoUpdates
	}
	us := slices.Clone(updates)
	slices.SortFunc(us, func(a, b Update) int { return cmp.Compare(a.Client, b.Client) })
	total := 0
	for i := range us {
		if i > 0 && us[i].Client == us[i-1].Client {
			return Stats{}, &InvalidUpdateError{Client: us[i].Client, Reason: "more than one update from this client"}
		}
		if err := us[i].check(len(global)); err != nil {
			return Stats{}, err
		}
		total += us[i].NumExamples
	}
	if total == 0 {
		return Stats{}, ErrNoExamples
	}
	s.w = slices.Grow(s.w[:0], len(us))[:len(us)]
	if err := s.Weighting.weights(s.w, us); err != nil {
		return Stats{}, err
	}
	s.delta = slices.Grow(s.delta[:0], len(global))[:len(global)]
	if err := s.Rule.Combine(s.delta, us, s.w); err != nil {
		return Stats{}, err
	}
	st := Stats{Clients: len(us), TotalExamples: total, Weights: make([]float64, len(us))}
	if _, ok := s.Rule.(*Mean); ok {
		var sum float64
		for _, w := range s.w {
			sum += w
		}
		for i, w := range s.w {
			st.Weights[i] = w / sum
		}
	} else {
		for i := range st.Weights {
			st.Weights[i] = 1 / float64(len(us))
		}
	}
	st.DeltaNorm = norm(s.delta)
	for _, u := range us {
		st.TrainLoss += u.TrainLoss * float64(u.NumExamples) / float64(total)
	}
	s.Server.Step(global, s.delta)
	return st, nil
}

// norm is the L2 norm of x, accumulated in float64.
func norm(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}
