package federated

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/eval"
	"github.com/gradsync/gradsync/models"
)

// SimConfig configures an in-process federated simulation: K virtual
// clients, each owning a slice of one training set, trained one after the
// other on one machine. Zero values take the documented defaults.
type SimConfig struct {
	// Train and Test are the data sets (read only). Required.
	Train, Test *data.Dataset
	// Partition[k] lists client k's example indices into Train (from
	// data.PartitionIID, PartitionDirichlet, …); K = len(Partition) ≥ 1.
	// Read only. Clients may be empty.
	Partition [][]int
	// Model is a models architecture name (models.Names); "" means logreg.
	Model string
	// Rounds is the number of rounds that must close. Required.
	Rounds int
	// Fraction is C: each round samples max(1, round(C·K)) clients.
	Fraction float64
	// LocalEpochs is E, passes over the local data per round; 0 means 1.
	LocalEpochs int
	// LocalBatch is B; 0 means the whole local data set (McMahan et al.'s
	// B = ∞, one step per epoch).
	LocalBatch int
	// ClientLR is the clients' SGD learning rate; 0 means 0.05.
	ClientLR float32
	// Mu is FedProx's μ ≥ 0: with μ > 0 the clients add the proximal term
	// (AddProximal). Strategy "fedprox" with Mu = 0 uses μ = 0.01.
	Mu float32
	// Strategy is the server's aggregation (NewStrategy).
	Strategy StrategyConfig
	// Reweighting of the clients' loss: "" or "none", or "class-balanced"
	// (ClassBalancedWeights of each client's own label histogram, with
	// Beta; 0 means β = 0.999).
	Reweighting string
	Beta        float64
	// MinClients, MaxRetries: as in ServerConfig.
	MinClients, MaxRetries int
	// StragglerProb is the probability that a sampled client never answers
	// in a round (drawn from Seed, round and client), to exercise
	// deadlines; such a round closes at its deadline with the others.
	StragglerProb float64
	// EvalEvery evaluates the global model on Test after every EvalEvery
	// closed rounds (and always after the last); 0 means 1.
	EvalEvery int
	// EvalBatch is the evaluation batch size; 0 means 500.
	EvalBatch int
	// Seed seeds the model's initial parameters, client sampling, local
	// shuffles and stragglers.
	Seed int64
	// Precision is the arithmetic of the clients' matrix products (and
	// of the global model's evaluation): models.FP32 (the zero value),
	// BF16 or FP16 (each local run with a fresh loss scaler: Trainer).
	Precision models.Precision
	// Parallel is how many clients train at once, each on its own network
	// (0: GOMAXPROCS). Results do not depend on it: every client trains
	// from the round's global model with randomness drawn from (Seed,
	// round, client), and updates are aggregated in client order.
	Parallel int
	// Progress, if non-nil, is called with each round's record as it is
	// made (on Simulate's goroutine).
	Progress func(Record)
	// AfterRound, if non-nil, is called after Progress with each closed
	// round's record (on Simulate's goroutine); Sim.Snapshot then returns
	// the state after that round, to checkpoint. An error stops the
	// simulation, which returns it.
	AfterRound func(Record) error
	// Resume, if non-nil, continues a run from a Snapshot (of a run with
	// the same configuration but Resume and the callbacks): the rounds
	// after it are those of an undisturbed run, bit for bit.
	Resume *Snapshot
}

// Snapshot is a simulation's state after a closed round: with the same
// SimConfig it is all a resumed run needs, as client sampling, local
// shuffles and stragglers are drawn from (Seed, round, …) and the
// clients' SGD keeps no state across rounds.
type Snapshot struct {
	// Round is the server round number of the last closed round, and
	// Completed the rounds closed by then (Round ≥ Completed: a failed
	// round's number is skipped).
	Round, Completed int
	// Model is the global model's state_dict by PyTorch name
	// (models.Network.State): the global parameters and the network's
	// buffers.
	Model map[string]models.Tensor
	// Server is the strategy's server optimiser state
	// (StatefulOptimizer), each buffer split by parameter as
	// "<state name>.<parameter name>" ("momentum.fc.weight", "m.…",
	// "v.…"); empty for stateless optimisers and before the first round.
	Server map[string]models.Tensor
}

// Record is one closed round of a simulation.
type Record struct {
	Round        int     // server round number (a failed round's number is skipped)
	Evaluated    bool    // TestAcc and TestLoss are set
	TestAcc      float64 // fraction of Test classified correctly by the new global model
	TestLoss     float64 // mean cross-entropy on Test
	TrainLoss    float64 // participants' last-epoch training loss, example-weighted mean
	Participants []int   // clients aggregated, ascending
	Missing      []int   // sampled clients that did not answer (stragglers)
	UpdateNorm   float64 // ‖Δ‖₂ of the combined delta
	LabelHists   [][]int // LabelHists[i] is Participants[i]'s label histogram
	Examples     int     // training examples processed in this round (local data × E, over the clients that trained)
	Skipped      int     // local steps the clients skipped in this round (fp16: inf/NaN gradients)
}

// History is the outcome of a simulation.
type History struct {
	Records      []Record
	FailedRounds int
	// FinalAcc and FinalLoss are the last evaluation's (for a multi-label
	// set, the subset accuracy and the mean BCE over classes).
	FinalAcc, FinalLoss float64
	// FinalMicroF1, FinalMacroF1 and FinalMAP are the last evaluation's
	// figures on a multi-label set (0 on a single-label one).
	FinalMicroF1, FinalMacroF1, FinalMAP float64
}

func (c SimConfig) withDefaults() SimConfig {
	if c.Model == "" {
		c.Model = "logreg"
	}
	if c.LocalEpochs == 0 {
		c.LocalEpochs = 1
	}
	if c.ClientLR == 0 {
		c.ClientLR = 0.05
	}
	if c.Strategy.Name == "fedprox" && c.Mu == 0 {
		c.Mu = 0.01
	}
	if c.Beta == 0 {
		c.Beta = 0.999
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = 1
	}
	if c.EvalBatch == 0 {
		c.EvalBatch = 500
	}
	return c
}

// Validate reports settings Simulate cannot run with.
func (c SimConfig) Validate() error {
	c = c.withDefaults()
	if c.Train == nil || c.Test == nil {
		return errors.New("federated: simulation needs Train and Test data sets")
	}
	var errs []error
	if c.Train.ImageSize() != c.Test.ImageSize() || c.Train.Classes != c.Test.Classes {
		errs = append(errs, fmt.Errorf("federated: train images %d×%d×%d with %d classes, test %d×%d×%d with %d",
			c.Train.C, c.Train.H, c.Train.W, c.Train.Classes, c.Test.C, c.Test.H, c.Test.W, c.Test.Classes))
	}
	if c.Train.MultiLabel() != c.Test.MultiLabel() {
		errs = append(errs, fmt.Errorf("federated: train multi-label %v, test multi-label %v: want both the same", c.Train.MultiLabel(), c.Test.MultiLabel()))
	}
	if c.Train.MultiLabel() && c.Reweighting == "class-balanced" {
		errs = append(errs, errors.New("federated: class-balanced reweighting weighs a softmax cross-entropy; a multi-label set trains with BCE (each client weighs positives by its own data instead)"))
	}
	for k, idx := range c.Partition {
		for _, i := range idx {
			if i < 0 || i >= c.Train.N {
				errs = append(errs, fmt.Errorf("federated: client %d's example index %d out of range [0, %d)", k, i, c.Train.N))
				break
			}
		}
	}
	if c.LocalEpochs < 0 || c.LocalBatch < 0 || c.EvalEvery < 0 || c.EvalBatch < 0 {
		errs = append(errs, fmt.Errorf("federated: local epochs %d, local batch %d, eval every %d, eval batch %d: must be ≥ 0",
			c.LocalEpochs, c.LocalBatch, c.EvalEvery, c.EvalBatch))
	}
	if !(c.ClientLR > 0) || c.Mu < 0 || math.IsInf(float64(c.Mu), 0) || math.IsNaN(float64(c.Mu)) {
		errs = append(errs, fmt.Errorf("federated: client lr %v must be > 0 and μ %v ≥ 0", c.ClientLR, c.Mu))
	}
	switch c.Reweighting {
	case "", "none", "class-balanced":
	default:
		errs = append(errs, fmt.Errorf("federated: reweighting %q, want none or class-balanced", c.Reweighting))
	}
	if !(c.Beta >= 0 && c.Beta < 1) {
		errs = append(errs, fmt.Errorf("federated: class-balanced β = %v, must be in [0, 1)", c.Beta))
	}
	if !(c.StragglerProb >= 0 && c.StragglerProb <= 1) {
		errs = append(errs, fmt.Errorf("federated: straggler probability %v, must be in [0, 1]", c.StragglerProb))
	}
	if _, err := NewStrategy(c.Strategy); err != nil {
		errs = append(errs, err)
	}
	if err := c.serverConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c SimConfig) serverConfig() ServerConfig {
	return ServerConfig{
		Clients: len(c.Partition), Fraction: c.Fraction, Rounds: c.Rounds,
		MinClients: c.MinClients, MaxRetries: c.MaxRetries, Seed: c.Seed,
	}
}

// Simulate runs a federated job end to end in process (NewSim, then
// Sim.Run): a Server (the same
// state machine the gRPC service drives) on a virtual clock, and the
// sampled clients trained by Parallel Trainers at once (each its own
// models.Network) — each copies the round's global parameters in, runs E
// local epochs of SGD with batch B (plus FedProx's proximal term when
// μ > 0), and submits params − global, in client order.
// Stragglers never answer; their round closes at its deadline. The global
// model is evaluated on Test every EvalEvery rounds. Simulate checks ctx
// between clients and returns ctx's error, with the history so far, when
// it is cancelled. A job failure (too many failed rounds) is returned with
// the history so far.
func Simulate(ctx context.Context, cfg SimConfig) (History, error) {
	s, err := NewSim(cfg)
	if err != nil {
		return History{}, err
	}
	return s.Run(ctx)
}

// Sim is one simulation (see Simulate); all buffers are allocated once.
// Run it once; Snapshot is for its callbacks and after Run.
type Sim struct {
	cfg      SimConfig
	net      *models.Network
	srv      *Server
	classes  int
	hists    [][]int     // per client, its label histogram
	cw       [][]float32 // per client, class-balanced loss weights; nil without reweighting
	start    []float32   // the round's global parameters, length P
	deltas   [][]float32 // one per sampled slot, length P each; lent to the Server until the round ends
	trainers []*Trainer  // Parallel of them, one per goroutine
	losses   []float64   // per sampled slot, its last-epoch loss
	trained  []bool      // per sampled slot, whether it answered
	examples int         // examples trained since the last closed round
	skipped  int         // local steps skipped (fp16) since the last closed round

	slotSkipped []int       // per sampled slot, the steps its client skipped
	slotBufs    [][]float32 // per sampled slot, its network's buffers after training (batch norm)
	evalX       []float32
	evalY       []int32
	evalPred    []int
	evalYM      []float32        // multi-label: multi-hot targets
	evalML      *eval.MultiLabel // multi-label: the last evaluation's figures
	now         time.Time
	hist        History
	// The state of the last closed round (or the start) that Snapshot
	// does not read from the server: its number, the rounds closed by
	// then, and the network's buffers then (later clients change them).
	lastRound, completed int
	closeBufs            []float32
}

// NewSim validates cfg and builds the simulation, from cfg.Resume if set.
func NewSim(cfg SimConfig) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tr := cfg.Train
	net, err := models.New(cfg.Model, models.Options{Channels: tr.C, Height: tr.H, Width: tr.W, Classes: tr.Classes, Seed: cfg.Seed})
	if err != nil {
		return nil, err
	}
	if err := net.SetPrecision(cfg.Precision); err != nil {
		return nil, err
	}
	strat, err := NewStrategy(cfg.Strategy)
	if err != nil {
		return nil, err
	}
	if r := cfg.Resume; r != nil {
		if err := r.Restore(net, strat); err != nil {
			return nil, err
		}
	}
	global := make([]float32, net.NumParams())
	copy(global, net.Params())
	srv, err := NewServer(cfg.serverConfig(), strat, global)
	if err != nil {
		return nil, err
	}
	m, _ := NumSampled(len(cfg.Partition), cfg.Fraction)
	s := &Sim{
		cfg: cfg, net: net, srv: srv, classes: tr.Classes,
		start: make([]float32, net.NumParams()), deltas: make([][]float32, m),
		now: time.Unix(0, 0).UTC(), closeBufs: slices.Clone(net.Buffers()),
	}
	if r := cfg.Resume; r != nil {
		if err := srv.Resume(r.Round, r.Completed); err != nil {
			return nil, err
		}
		s.lastRound, s.completed = r.Round, r.Completed
	}
	maxLocal := 0
	for k, idx := range cfg.Partition {
		maxLocal = max(maxLocal, len(idx))
		s.hists = append(s.hists, tr.LabelHistogram(idx))
		if cfg.Reweighting == "class-balanced" {
			w, err := ClassBalancedWeights(s.hists[k], cfg.Beta)
			if err != nil {
				return nil, err
			}
			w32 := make([]float32, len(w))
			for c, v := range w {
				w32[c] = float32(v)
			}
			s.cw = append(s.cw, w32)
		}
	}
	for i := range s.deltas {
		s.deltas[i] = make([]float32, net.NumParams())
	}
	par := cfg.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	for range min(par, max(m, 1)) {
		t, err := NewTrainer(cfg.Model, tr, cfg.Seed, maxLocal, cfg.LocalBatch, cfg.Precision)
		if err != nil {
			return nil, err
		}
		s.trainers = append(s.trainers, t)
	}
	s.losses, s.trained, s.slotSkipped = make([]float64, m), make([]bool, m), make([]int, m)
	if len(net.Buffers()) > 0 {
		for range m {
			s.slotBufs = append(s.slotBufs, make([]float32, len(net.Buffers())))
		}
	}
	eb := min(cfg.EvalBatch, cfg.Test.N)
	s.evalX = make([]float32, eb*tr.ImageSize())
	s.evalY = make([]int32, eb)
	s.evalPred = make([]int, eb)
	if tr.MultiLabel() {
		s.evalYM, s.evalML = make([]float32, eb*tr.Classes), eval.NewMultiLabel(tr.Classes)
	}
	return s, nil
}

// Snapshot returns the state after the last closed round (or the start,
// or the resumed snapshot, before any): call it from AfterRound, or after
// Run. The tensors are copies.
func (s *Sim) Snapshot() Snapshot {
	return NewSnapshot(s.lastRound, s.completed, s.net, s.srv.Global(), s.closeBufs, s.srv.strategy)
}

// Global is the global model's parameters now (read only).
func (s *Sim) Global() []float32 { return s.srv.Global() }

// Run runs the simulation's rounds; see Simulate.
func (s *Sim) Run(ctx context.Context) (History, error) {
	queue, err := s.srv.Start(s.now)
	if err != nil {
		return s.hist, err
	}
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		switch a := a.(type) {
		case *OpenRound:
			more, err := s.round(ctx, a)
			queue = append(queue, more...)
			if err != nil {
				s.drain(queue)
				return s.hist, err
			}
		case *RoundClosed:
			s.closed(a)
			if s.cfg.AfterRound != nil {
				if err := s.cfg.AfterRound(s.hist.Records[len(s.hist.Records)-1]); err != nil {
					return s.hist, err
				}
			}
		case *RoundFailed:
			s.hist.FailedRounds++
		case *Finished:
		}
	}
	return s.hist, nil
}

// drain records the closes and failures among the actions left when the
// job stops with an error.
func (s *Sim) drain(queue []Action) {
	for _, a := range queue {
		switch a := a.(type) {
		case *RoundClosed:
			s.closed(a)
		case *RoundFailed:
			s.hist.FailedRounds++
		}
	}
}

// round trains every sampled, non-straggling client of the open round —
// in parallel on the trainers, each from the round's global model — then
// submits their updates in client order (so the result does not depend on
// the parallelism), then lets the deadline pass if the round is still
// open.
func (s *Sim) round(ctx context.Context, open *OpenRound) ([]Action, error) {
	copy(s.start, open.Global)
	if err := s.trainAll(ctx, open); err != nil {
		return nil, err
	}
	var acts []Action
	for i, k := range open.Clients {
		if !s.trained[i] {
			continue
		}
		more, err := s.srv.Submit(s.now, Update{
			Client: k, Round: open.Round, Delta: s.deltas[i], NumExamples: len(s.cfg.Partition[k]),
			LabelHist: s.hists[k], MultiLabel: s.cfg.Train.MultiLabel(), TrainLoss: s.losses[i],
		})
		acts = append(acts, more...)
		if err != nil {
			return acts, err
		}
	}
	s.mergeBuffers(open)
	if s.srv.Round() == open.Round && s.srv.Completed() < s.cfg.Rounds && s.srv.Err() == nil {
		// Not everyone answered: the round is still open until its deadline.
		s.now = open.Deadline
		more, err := s.srv.Tick(s.now)
		acts = append(acts, more...)
		if err != nil {
			return acts, err
		}
	}
	s.now = s.now.Add(time.Second)
	return acts, nil
}

// trainAll trains the round's answering clients on the trainers, several
// at once, leaving slot i's delta, loss and buffers in s.deltas[i],
// s.losses[i] and s.slotBufs[i].
func (s *Sim) trainAll(ctx context.Context, open *OpenRound) error {
	var todo []int // slots
	for i, k := range open.Clients {
		s.trained[i] = !(s.cfg.StragglerProb > 0 && newRand(s.cfg.Seed, streamStraggler, uint64(open.Round), uint64(k)).Float64() < s.cfg.StragglerProb)
		if s.trained[i] {
			todo = append(todo, i)
			s.examples += len(s.cfg.Partition[k]) * max(s.cfg.LocalEpochs, 1)
		}
	}
	for _, i := range todo {
		s.slotSkipped[i] = 0
	}
	startBufs := s.closeBufs
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, t := range s.trainers[:min(len(s.trainers), len(todo))] {
		wg.Go(func() {
			for {
				j := int(next.Add(1)) - 1
				if j >= len(todo) || ctx.Err() != nil {
					return
				}
				i := todo[j]
				k := open.Clients[i]
				cfg := LocalConfig{Epochs: s.cfg.LocalEpochs, Batch: s.cfg.LocalBatch, LR: s.cfg.ClientLR, Mu: s.cfg.Mu,
					Seed: s.cfg.Seed, Round: open.Round, Client: k}
				if s.cw != nil {
					cfg.ClassWeights = s.cw[k]
				}
				s.losses[i] = t.Train(s.cfg.Train, s.cfg.Partition[k], s.start, startBufs, cfg)
				s.slotSkipped[i] = t.Skipped()
				delta := s.deltas[i]
				for j, p := range t.net.Params() {
					delta[j] = p - s.start[j]
				}
				if s.slotBufs != nil {
					copy(s.slotBufs[i], t.net.Buffers())
				}
			}
		})
	}
	wg.Wait()
	for _, i := range todo {
		s.skipped += s.slotSkipped[i]
	}
	return ctx.Err()
}

// mergeBuffers sets the global network's non-trainable buffers (batch-norm
// running statistics, which the strategies do not aggregate) to the
// example-weighted mean of the round's trained clients', as FedAvg over a
// whole state_dict does.
func (s *Sim) mergeBuffers(open *OpenRound) {
	if s.slotBufs == nil {
		return
	}
	bufs := s.net.Buffers()
	var total float64
	for i, k := range open.Clients {
		if s.trained[i] {
			total += float64(len(s.cfg.Partition[k]))
		}
	}
	if total == 0 {
		return
	}
	acc := make([]float64, len(bufs))
	for i, k := range open.Clients {
		if !s.trained[i] {
			continue
		}
		w := float64(len(s.cfg.Partition[k])) / total
		for j, v := range s.slotBufs[i] {
			acc[j] += w * float64(v)
		}
	}
	for j, v := range acc {
		bufs[j] = float32(v)
	}
}

func (s *Sim) closed(c *RoundClosed) {
	rec := Record{Round: c.Round, Participants: c.Participants, Missing: c.Missing,
		UpdateNorm: c.Stats.DeltaNorm, TrainLoss: c.Stats.TrainLoss, Examples: s.examples, Skipped: s.skipped}
	s.examples, s.skipped = 0, 0
	for _, k := range c.Participants {
		rec.LabelHists = append(rec.LabelHists, slices.Clone(s.hists[k]))
	}
	s.lastRound = c.Round
	s.completed++
	copy(s.closeBufs, s.net.Buffers())
	if s.completed == s.cfg.Rounds || s.completed%s.cfg.EvalEvery == 0 {
		rec.Evaluated = true
		rec.TestAcc, rec.TestLoss = s.evaluate(c.Global)
		s.hist.FinalAcc, s.hist.FinalLoss = rec.TestAcc, rec.TestLoss
		if m := s.evalML; m != nil {
			s.hist.FinalMicroF1, s.hist.FinalMacroF1, s.hist.FinalMAP = m.MicroF1(), m.MacroF1(), m.MAP()
		}
	}
	s.hist.Records = append(s.hist.Records, rec)
	if s.cfg.Progress != nil {
		s.cfg.Progress(rec)
	}
}

// evaluate returns the accuracy and mean cross-entropy of params on Test
// (for a multi-label set, the subset accuracy and mean BCE, with the
// other figures in s.evalML).
func (s *Sim) evaluate(params []float32) (acc, loss float64) {
	copy(s.net.Params(), params)
	te := s.cfg.Test
	sz := te.ImageSize()
	idx := make([]int, len(s.evalY))
	if te.MultiLabel() {
		s.evalML.Reset()
		var lsum float64
		for off := 0; off < te.N; off += len(s.evalY) {
			b := min(len(s.evalY), te.N-off)
			for i := range b {
				idx[i] = off + i
			}
			x, y := s.evalX[:b*sz], s.evalYM[:b*s.classes]
			te.MultiHot(idx[:b], x, y)
			logits := s.net.Forward(x, b, false)
			lsum += float64(models.BCEWithLogits(logits, y, nil, nil)) * float64(b)
			s.evalML.Add(logits, y)
		}
		return s.evalML.SubsetAccuracy(), lsum / float64(max(te.N, 1))
	}
	var correct int
	var lsum float64
	for off := 0; off < te.N; off += len(s.evalY) {
		b := min(len(s.evalY), te.N-off)
		for i := range b {
			idx[i] = off + i
		}
		x, y, pred := s.evalX[:b*sz], s.evalY[:b], s.evalPred[:b]
		te.Batch(idx[:b], x, y)
		logits := s.net.Forward(x, b, false)
		lsum += float64(models.SoftmaxCrossEntropy(logits, y, s.classes, nil)) * float64(b)
		eval.Argmax(logits, s.classes, pred)
		for i, p := range pred {
			if p == int(y[i]) {
				correct++
			}
		}
	}
	return float64(correct) / float64(te.N), lsum / float64(te.N)
}
