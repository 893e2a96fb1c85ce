package federated

import (
	"fmt"
	"math"
	"slices"
)

// ServerOptimizer applies the round's pseudo-gradient to the global
// parameters (Reddi et al. 2021, "Adaptive Federated Optimization",
// Algorithm 1: the server treats −Δ as a gradient).
type ServerOptimizer interface {
	// Step updates global (length P) in place from delta (length P, the
	// combined client deltas); delta is only read. State, if any, belongs
	// to the optimiser and is created on the first Step.
	Step(global, delta []float32)
}

// StatefulOptimizer is a ServerOptimizer whose state carries across
// rounds (FedAvgM's velocity, FedAdam's and FedYogi's moments), so that a
// checkpoint can save it and a resumed run continue bit for bit.
type StatefulOptimizer interface {
	ServerOptimizer
	// StateNames names the state buffers, in a fixed order.
	StateNames() []string
	// State returns the state buffers by name, each of length P, or nil
	// before the first Step. They are the optimiser's: copy, don't keep.
	State() map[string][]float32
	// SetState replaces the state with copies of the named buffers (all
	// of StateNames, of one length); nil forgets it, as before the first
	// Step.
	SetState(state map[string][]float32) error
}

// ServerSGD is x ← x + LR·Δ. LR = 1 is FedAvg (the new global model is the
// weighted mean of the client models). The zero value means LR = 1.
type ServerSGD struct {
	LR float64
}

// Step implements ServerOptimizer.
func (o *ServerSGD) Step(global, delta []float32) {
	mustSameLen("ServerSGD", global, delta)
	lr := o.LR
	if lr == 0 {
		lr = 1
	}
	for j, d := range delta {
		global[j] = float32(float64(global[j]) + lr*float64(d))
	}
}

// ServerMomentum is FedAvgM (Hsu et al. 2019): server heavy-ball momentum
// on the pseudo-gradient,
//
//	v ← β·v + Δ        (v starts at 0)
//	x ← x + η·v
//
// The steady-state step is η/(1−β) times FedAvg's; Hsu et al. find the best
// results near η/(1−β) ≈ 1, hence the defaults η = 0.1 (LR), β = 0.9
// (Momentum) when the fields are 0. It smooths the round-to-round swings
// that Non-IID client sampling causes.
type ServerMomentum struct {
	LR, Momentum float64
	v            []float32
}

// Step implements ServerOptimizer.
func (o *ServerMomentum) Step(global, delta []float32) {
	mustSameLen("ServerMomentum", global, delta)
	lr, beta := orDefault(o.LR, 0.1), orDefault(o.Momentum, 0.9)
	if o.v == nil {
		o.v = make([]float32, len(global))
	}
	for j, d := range delta {
		v := beta*float64(o.v[j]) + float64(d)
		o.v[j] = float32(v)
		global[j] = float32(float64(global[j]) + lr*v)
	}
}

// StateNames implements StatefulOptimizer: the velocity v.
func (o *ServerMomentum) StateNames() []string { return []string{"momentum"} }

// State implements StatefulOptimizer.
func (o *ServerMomentum) State() map[string][]float32 {
	if o.v == nil {
		return nil
	}
	return map[string][]float32{"momentum": o.v}
}

// SetState implements StatefulOptimizer.
func (o *ServerMomentum) SetState(state map[string][]float32) error {
	bufs, err := stateBuffers("ServerMomentum", o.StateNames(), state)
	if err != nil {
		return err
	}
	o.v = bufs[0]
	return nil
}

// Adaptive is FedAdam or FedYogi (Reddi et al. 2021, Algorithm 2), with
// m starting at 0 and v at τ² (the paper's v₋₁ ≥ τ²) and no bias
// correction, as in the paper:
//
//	m ← β1·m + (1−β1)·Δ
//	v ← β2·v + (1−β2)·Δ²                    (Adam)
//	v ← v − (1−β2)·Δ²·sign(v − Δ²)          (Yogi)
//	x ← x + η·m / (√v + τ)
//
// Zero fields take the defaults of Reddi et al.'s experiments (and
// Flower's FedYogi): η (LR) = 0.01, β1 = 0.9, β2 = 0.99, τ (Tau) = 1e-3.
// τ bounds the per-coordinate step (≤ η·|m|/τ) and sets how adaptive the
// method is: small τ is closer to sign descent. Yogi's additive v update
// grows v more slowly than Adam's, so the effective learning rate decays
// less abruptly when a rare large Δ appears. State is kept in float32
// (like internal/optim), each update computed in float64.
type Adaptive struct {
	Yogi                  bool
	LR, Beta1, Beta2, Tau float64
	m, v                  []float32
}

// Step implements ServerOptimizer.
func (o *Adaptive) Step(global, delta []float32) {
	mustSameLen("Adaptive", global, delta)
	lr, b1, b2, tau := o.params()
	if o.m == nil {
		o.m = make([]float32, len(global))
		o.v = make([]float32, len(global))
		for j := range o.v {
			o.v[j] = float32(tau * tau)
		}
	}
	for j, d64 := range delta {
		d := float64(d64)
		m := b1*float64(o.m[j]) + (1-b1)*d
		v := float64(o.v[j])
		d2 := d * d
		if o.Yogi {
			v -= (1 - b2) * d2 * sign(v-d2)
		} else {
			v = b2*v + (1-b2)*d2
		}
		o.m[j], o.v[j] = float32(m), float32(v)
		global[j] = float32(float64(global[j]) + lr*m/(math.Sqrt(v)+tau))
	}
}

// StateNames implements StatefulOptimizer: the moments m and v.
func (o *Adaptive) StateNames() []string { return []string{"m", "v"} }

// State implements StatefulOptimizer.
func (o *Adaptive) State() map[string][]float32 {
	if o.m == nil {
		return nil
	}
	return map[string][]float32{"m": o.m, "v": o.v}
}

// SetState implements StatefulOptimizer.
func (o *Adaptive) SetState(state map[string][]float32) error {
	bufs, err := stateBuffers("Adaptive", o.StateNames(), state)
	if err != nil {
		return err
	}
	o.m, o.v = bufs[0], bufs[1]
	return nil
}

// stateBuffers returns copies of state's buffers in the order of names
// (nil for a nil state), checking that there are exactly those, all of
// one length.
func stateBuffers(who string, names []string, state map[string][]float32) ([][]float32, error) {
	out := make([][]float32, len(names))
	if state == nil {
		return out, nil
	}
	if len(state) != len(names) {
		return nil, fmt.Errorf("federated: %s.SetState: %d buffers, want %v", who, len(state), names)
	}
	for i, n := range names {
		b, ok := state[n]
		if !ok {
			return nil, fmt.Errorf("federated: %s.SetState: no buffer %q (want %v)", who, n, names)
		}
		if len(b) != len(state[names[0]]) {
			return nil, fmt.Errorf("federated: %s.SetState: buffer %q has length %d, %q %d", who, n, len(b), names[0], len(state[names[0]]))
		}
		out[i] = slices.Clone(b)
	}
	return out, nil
}

func (o *Adaptive) params() (lr, b1, b2, tau float64) {
	return orDefault(o.LR, 0.01), orDefault(o.Beta1, 0.9), orDefault(o.Beta2, 0.99), orDefault(o.Tau, 1e-3)
}

func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

func orDefault(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return v
}

func mustSameLen(who string, global, delta []float32) {
	if len(global) != len(delta) {
		panic(fmt.Sprintf("federated: %s.Step: len(global)=%d != len(delta)=%d", who, len(global), len(delta)))
	}
}
