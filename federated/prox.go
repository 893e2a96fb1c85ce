package federated

import "fmt"

// AddProximal adds FedProx's proximal term (Li et al. 2020) to a client's
// gradient: the client minimises F_k(w) + μ/2·‖w − w_global‖², so
//
//	grads[i] += μ·(params[i] − global[i])
//
// and the term's value μ/2·‖w − w_global‖² is returned (add it to the data
// loss when reporting the objective). grads, params and global have the
// same length P (the model's flat buffers); grads is written, the others
// only read. μ = 0 leaves grads unchanged and returns 0 (plain FedAvg
// local training). Call it after Backward and before the optimiser step.
func AddProximal(grads, params, global []float32, mu float32) (loss float64) {
	if len(grads) != len(params) || len(params) != len(global) {
		panic(fmt.Sprintf("federated: AddProximal: len(grads)=%d, len(params)=%d, len(global)=%d must be equal",
			len(grads), len(params), len(global)))
	}
	if mu == 0 {
		return 0
	}
	var ss float64
	for i, p := range params {
		d := p - global[i]
		grads[i] += mu * d
		ss += float64(d) * float64(d)
	}
	return float64(mu) / 2 * ss
}
