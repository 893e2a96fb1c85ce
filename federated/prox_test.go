package federated

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/models"
)

// TestAddProximalFiniteDifferences checks that the gradient AddProximal
// adds is the derivative of the value it returns, alone and on top of a
// real network's loss (the FedProx client objective).
func TestAddProximalFiniteDifferences(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	net, err := models.New("logreg", models.Options{Channels: 1, Height: 3, Width: 3, Classes: 4, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	const batch, mu = 5, 0.3
	x := make([]float32, batch*9)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	y := []uint8{0, 3, 1, 2, 3}
	params := net.Params()
	global := slices.Clone(params)
	for i := range params { // move away from global so the term is non-zero
		params[i] += float32(0.5 * r.NormFloat64())
	}
	dl := make([]float32, batch*4)
	objective := func() float64 {
		l := models.SoftmaxCrossEntropy(net.Forward(x, batch, true), y, 4, nil)
		scratch := make([]float32, len(params))
		return float64(l) + AddProximal(scratch, params, global, mu)
	}
	net.ZeroGrad()
	models.SoftmaxCrossEntropy(net.Forward(x, batch, true), y, 4, dl)
	net.Backward(dl)
	before := slices.Clone(net.Grads())
	prox := AddProximal(net.Grads(), params, global, mu)
	var want float64
	for i := range params {
		d := float64(params[i] - global[i])
		want += d * d
	}
	if want *= mu / 2; math.Abs(prox-want) > 1e-6*want {
		t.Fatalf("proximal loss %v, want μ/2‖w−w_g‖² = %v", prox, want)
	}
	for i, g := range net.Grads() {
		if added := float64(g - before[i]); math.Abs(added-mu*float64(params[i]-global[i])) > 1e-6 {
			t.Fatalf("grads[%d] gained %v, want μ(w−w_g) = %v", i, added, mu*float64(params[i]-global[i]))
		}
	}
	const eps = 1e-2
	for _, i := range []int{0, 5, 17, len(params) - 1} {
		p := params[i]
		params[i] = p + eps
		up := objective()
		params[i] = p - eps
		down := objective()
		params[i] = p
		fd := (up - down) / (2 * eps)
		if g := float64(net.Grads()[i]); math.Abs(fd-g) > 2e-3*max(1, math.Abs(fd)) {
			t.Errorf("param %d: analytic %v, finite difference %v", i, g, fd)
		}
	}
	g := []float32{1, 2}
	if l := AddProximal(g, []float32{3, 4}, []float32{0, 0}, 0); l != 0 || g[0] != 1 || g[1] != 2 {
		t.Errorf("μ = 0 changed the gradient to %v or returned %v", g, l)
	}
}
