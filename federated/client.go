package federated

import (
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// LocalConfig is what one client's local training in one round needs
// besides its data: the round's settings and where its randomness comes
// from.
type LocalConfig struct {
	// Epochs is E ≥ 1; Batch is B (0: the whole local data set, one step
	// per epoch).
	Epochs, Batch int
	// LR is the client's SGD learning rate; Mu FedProx's μ (0: plain).
	LR, Mu float32
	// ClassWeights, if set, weight the loss per class (class-balanced
	// reweighting).
	ClassWeights []float32
	// Seed, Round and Client seed the local shuffles and the dropout masks,
	// so a client's update is a pure function of them, its data and the
	// global model — whichever trainer runs it, in whatever order.
	Seed          int64
	Round, Client int
}

// Trainer trains clients locally: a network and buffers sized once for
// the largest batch it will see. It is not safe for concurrent use; run
// one per goroutine.
//
// With fp16 each local training run has a loss scaler of its own that
// starts afresh (GradScaler's defaults: 2^16, ×2 after 2,000 clean steps,
// ×0.5 and the step skipped on inf/NaN), so a client's update stays a
// pure function of its inputs whichever trainer runs it; Skipped says how
// many of its steps were skipped.
type Trainer struct {
	net     *models.Network
	sgd     optim.SGD
	idx     []int
	x       []float32
	y       []int32
	ym      []float32 // multi-hot targets of a multi-label set
	pw      []float32 // and its positives' weights, (n−P)/P per class
	dlogits []float32
	skipped int // steps the last Train skipped (fp16: non-finite gradients)
}

// NewTrainer returns a trainer for model over images shaped like ds, for
// local data sets of at most maxLocal examples and batch B (0: whole),
// whose matrix products run in precision prec (models.FP32, BF16 or
// FP16, autocast semantics; master weights and the optimiser in fp32).
func NewTrainer(model string, ds *data.Dataset, seed int64, maxLocal, batch int, prec models.Precision) (*Trainer, error) {
	net, err := models.New(model, models.Options{Channels: ds.C, Height: ds.H, Width: ds.W, Classes: ds.Classes, Seed: seed})
	if err != nil {
		return nil, err
	}
	if err := net.SetPrecision(prec); err != nil {
		net.Close()
		return nil, err
	}
	b := maxLocal
	if batch > 0 {
		b = min(batch, maxLocal)
	}
	b = max(b, 1)
	t := &Trainer{
		net: net, idx: make([]int, 0, maxLocal),
		x: make([]float32, b*ds.ImageSize()), y: make([]int32, b), dlogits: make([]float32, b*ds.Classes),
	}
	if ds.MultiLabel() {
		t.ym, t.pw = make([]float32, b*ds.Classes), make([]float32, ds.Classes)
	}
	return t, nil
}

// Network is the trainer's network: after Train its parameters and
// buffers are the client's.
func (t *Trainer) Network() *models.Network { return t.net }

// Skipped returns how many steps the last Train skipped because the fp16
// loss scaler found inf or NaN gradients (always 0 in fp32 and bf16).
func (t *Trainer) Skipped() int { return t.skipped }

// Train runs a client's local epochs on ds[idx] starting from the global
// parameters start and buffers startBufs (nil: keep the network's), and
// returns its mean loss over the last epoch (0 with no examples, when the
// parameters stay at start). The trained parameters are in
// Network().Params(). Its batches never exceed the size NewTrainer was
// given.
func (t *Trainer) Train(ds *data.Dataset, idx []int, start, startBufs []float32, cfg LocalConfig) float64 {
	params, grads := t.net.Params(), t.net.Grads()
	copy(params, start)
	if startBufs != nil {
		copy(t.net.Buffers(), startBufs)
	}
	t.idx = append(t.idx[:0], idx...)
	t.skipped = 0
	n := len(t.idx)
	if n == 0 {
		return 0
	}
	var scaler *optim.LossScaler
	if t.net.Precision() == models.FP16 {
		scaler, _ = optim.NewLossScaler(optim.ScalerConfig{}) // the defaults are valid
	}
	t.net.SetDropoutStream(splitmix64(uint64(cfg.Round)<<32 ^ uint64(cfg.Client)))
	t.sgd.LR = cfg.LR
	bs := n
	if cfg.Batch > 0 {
		bs = min(cfg.Batch, n)
	}
	bs = min(bs, len(t.y))
	sz, classes := ds.ImageSize(), ds.Classes
	if ds.MultiLabel() {
		// The client weighs each class's positives by its own data's
		// (n − P)/P (1 for a class it never sees), as ps and ring jobs
		// weigh them by the training set's: torch's pos_weight.
		clear(t.pw)
		for _, i := range t.idx {
			for _, l := range ds.LabelSets[i] {
				t.pw[l]++
			}
		}
		for c, p := range t.pw {
			t.pw[c] = 1
			if p > 0 {
				t.pw[c] = (float32(n) - p) / p
			}
		}
	}
	var last float64
	for e := range max(cfg.Epochs, 1) {
		r := newRand(cfg.Seed, streamShuffle, uint64(cfg.Round), uint64(cfg.Client), uint64(e))
		r.Shuffle(n, func(i, j int) { t.idx[i], t.idx[j] = t.idx[j], t.idx[i] })
		var sum float64
		for off := 0; off < n; off += bs {
			b := min(bs, n-off)
			x, y, dl := t.x[:b*sz], t.y[:b], t.dlogits[:b*classes]
			if ds.MultiLabel() {
				ds.MultiHot(t.idx[off:off+b], x, t.ym[:b*classes])
			} else {
				ds.Batch(t.idx[off:off+b], x, y)
			}
			t.net.ZeroGrad()
			logits := t.net.Forward(x, b, true)
			var l float32
			switch {
			case ds.MultiLabel(): // BCE with logits, as ps and ring train multi-label sets
				l = models.BCEWithLogits(logits, t.ym[:b*classes], t.pw, dl)
			case cfg.ClassWeights != nil:
				l = models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: cfg.ClassWeights}, dl)
			default:
				l = models.SoftmaxCrossEntropy(logits, y, classes, dl)
			}
			sum += float64(l) * float64(b)
			if scaler != nil {
				sc := scaler.Scale()
				for i := range dl {
					dl[i] *= sc
				}
			}
			t.net.Backward(dl)
			if scaler != nil && !scaler.Update(scaler.Unscale(grads)) {
				t.skipped++
				continue
			}
			AddProximal(grads, params, start, cfg.Mu)
			t.sgd.Step(params, grads)
		}
		last = sum / float64(n)
	}
	return last
}
