package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/tensorpar"
)

// A tensor-parallel job (parallelism.tensor T, workers = D × T) puts rank
// r on tensor rank r mod T of data replica r / T; the T ranks of a
// replica train on the same batch. For mlp (Flatten, fc1 784→256, ReLU,
// fc2 256→128, ReLU, fc3 128→classes) fc1 and fc2 are a Megatron pair
// (tensorpar.MLP with ReLU): fc1 column-parallel, fc2 row-parallel, the
// 256 hidden units split over the T ranks; one all-reduce of b·128
// values forward (g), none backward (fc1 is the network's first layer:
// no input gradient, so f's all-reduce is not needed). The ReLU after fc2
// and fc3 are replicated (the Trainer's network: fc3's block alone,
// models.NewStage), and their gradients are the same on every rank of the
// replica. The replicas of a tensor rank average its gradients over a
// ring of their own; every rank steps its own optimisers (element-wise).
// Checkpoints and the checksum are the whole model's (GatherParams, and
// MLP.Gather for the optimiser's state).

// tensorCut is where a tensor-parallel model's replicated part starts
// (the block after its Megatron pair), and the pair's sizes.
type tensorCut struct {
	boundary            string
	in, hidden, out     int
	pair, rest          models.Stage
	pairParams, classes int
}

// tensorCutOf cuts spec's model (mlp only: jobspec.TensorModels).
func tensorCutOf(spec *pb.JobSpec, opt models.Options) (tensorCut, error) {
	if spec.Model != "mlp" {
		return tensorCut{}, fmt.Errorf("tensor parallelism: model %s is not split yet (allowed: mlp)", spec.Model)
	}
	whole, err := models.New(spec.Model, opt)
	if err != nil {
		return tensorCut{}, err
	}
	defer whole.Close()
	parts, err := models.Partition(whole, 2, models.Balance{Boundaries: []string{"fc3"}})
	if err != nil {
		return tensorCut{}, err
	}
	o := whole.Options()
	c := tensorCut{boundary: "fc3", in: o.Channels * o.Height * o.Width, hidden: 256, out: 128, pair: parts[0], rest: parts[1], classes: o.Classes}
	c.pairParams = c.hidden*c.in + c.hidden + c.out*c.hidden + c.out
	if c.pair.ParamLen != c.pairParams {
		return tensorCut{}, fmt.Errorf("tensor parallelism: mlp's fc1 and fc2 hold %d parameters, want %d", c.pair.ParamLen, c.pairParams)
	}
	return c, nil
}

// tensorRest builds a tensor-parallel rank's network: the model's
// replicated part alone (for mlp, fc3), with the whole model's initial
// values.
func tensorRest(spec *pb.JobSpec, opt models.Options) (*models.Network, error) {
	c, err := tensorCutOf(spec, opt)
	if err != nil {
		return nil, err
	}
	net, _, err := models.NewStage(spec.Model, opt, 2, models.Balance{Boundaries: []string{c.boundary}}, 1)
	return net, err
}

// tensorTask is a tensor-parallel job's synchronizer (see above).
type tensorTask struct {
	unscaled
	*meshGroup // the replica's T ranks (group), this tensor rank's D replicas
	a          *pb.Assignment
	env        *taskEnv
	obj        objective
	net        *models.Network // the replicated part alone (fc3)
	cut        tensorCut

	mlp    *tensorpar.MLP
	relu   models.ReLU // after fc2
	mlpOpt optim.Stepper
	netOpt optim.Stepper
	ckpt   *checkpointer

	x, dl []float32
	sum   uint64

	// the training steps' communication in the group, and the formula's
	trainSteps                int64
	counted                   tensorpar.Counts
	formulaOps, formulaValues int64
	groupBytes                int64 // the group ring's bytes sent in training steps
}

func newTensorTask(ctx context.Context, a *pb.Assignment, env *taskEnv, net *models.Network, obj objective, totalSteps int64) (_ *tensorTask, err error) {
	spec := a.Spec
	if _, ok := obj.(*classification); !ok {
		return nil, fmt.Errorf("tensor parallelism: the job's data set is not single-label classification (%T)", obj)
	}
	cut, err := tensorCutOf(spec, net.Options())
	if err != nil {
		return nil, err
	}
	if held, _, ok := net.HeldStage(); !ok || held != 1 {
		return nil, errors.New("tensor parallelism: the rank's network is not the model's replicated part alone")
	}
	c := groupCoord(a, jobspec.TensorRanks(spec))
	b := int(spec.GetBatchSize())
	m, err := joinMesh(ctx, a, env, c, "tensor rank", "%s/tensor-%d", "%s/tensor-rank-%d", totalSteps)
	if err != nil {
		return nil, fmt.Errorf("tensor parallelism: %w", err)
	}
	t := &tensorTask{meshGroup: m, a: a, env: env, obj: obj, net: net, cut: cut,
		mlpOpt: optim.FromSpec(spec), netOpt: optim.FromSpec(spec),
		x: make([]float32, b*cut.in), dl: make([]float32, b*cut.classes)}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	jctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	if t.mlp, err = tensorpar.NewMLPWith(jctx, t.group, cut.in, cut.hidden, cut.out, tensorpar.MLPOptions{ReLU: true, NoInputGrad: true}); err != nil {
		return nil, err
	}
	// The whole model's initial fc1 and fc2 (their stage alone), then
	// this rank's shard of them.
	pn, _, err := models.NewStage(spec.Model, net.Options(), 2, models.Balance{Boundaries: []string{cut.boundary}}, 0)
	if err != nil {
		return nil, err
	}
	defer pn.Close()
	if err := t.mlp.SetFromFull(t.pairWeights(pn.Params())); err != nil {
		return nil, err
	}
	env.log.Debug("tensor rank ready", "job", a.JobId, "rank", a.Rank, "tensor_rank", c.shard, "tensor", c.shards,
		"replica", c.replica, "replicas", c.replicas, "hidden", t.mlp.Hi-t.mlp.Lo)
	return t, nil
}

// pairWeights views a flat buffer laid out as the model's fc1 and fc2
// (fc1.weight, fc1.bias, fc2.weight, fc2.bias) as MLPWeights.
func (t *tensorTask) pairWeights(flat []float32) tensorpar.MLPWeights {
	c := t.cut
	n1 := c.hidden*c.in + c.hidden
	return tensorpar.MLPWeights{W1: flat[:c.hidden*c.in], B1: flat[c.hidden*c.in : n1], W2: flat[n1 : n1+c.out*c.hidden], B2: flat[n1+c.out*c.hidden : c.pairParams]}
}

// flatPair is pairWeights's inverse.
func flatPair(w tensorpar.MLPWeights) []float32 { return slices.Concat(w.W1, w.B1, w.W2, w.B2) }

func (t *tensorTask) start(ctx context.Context, from resumeFrom) (origin, error) {
	if t.a.CheckpointDir != "" {
		t.ckpt = &checkpointer{dir: t.a.CheckpointDir, spec: t.spec, jobID: t.a.JobId, world: int(t.a.WorldSize), lastSave: time.Now(), meta: t.env.modelMeta}
	}
	source := fromScratch
	if from.ckpt != nil {
		if err := t.restore(from.ckpt); err != nil {
			return origin{}, err
		}
		t.steps = from.at.step
		source = fromCheckpoint
	}
	if err := t.wholeChecksum(ctx); err != nil {
		return origin{}, err
	}
	return origin{at: from.at, source: source}, nil
}

func (t *tensorTask) beginStep(context.Context, []float32) (func(int), error) {
	clear(t.mlp.Grads())
	return nil, nil
}

// forward runs batch n of x through the pair (one all-reduce), the ReLU
// and the replicated part, and returns the logits.
func (t *tensorTask) forward(ctx context.Context, x []float32, n int, train bool) ([]float32, error) {
	y, err := t.mlp.Forward(ctx, x, n)
	if err != nil {
		return nil, fmt.Errorf("tensor rank %d: %w", t.coord.shard, err)
	}
	return t.net.ForwardStage(t.cut.rest, t.relu.Forward(y, n, train), n, train), nil
}

func (t *tensorTask) gradient(ctx context.Context, _ int64, epoch int, batch []int, _ func() (float32, error)) (float32, error) {
	n := len(batch)
	if n == 0 {
		return 0, nil
	}
	x := t.x[:n*t.cut.in]
	if err := t.obj.batch(batch, x, epoch); err != nil {
		return 0, err
	}
	sctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	before := t.group.Counts()
	sentBefore, _, _, _ := t.groupRing.Traffic()
	logits, err := t.forward(sctx, x, n, true)
	if err != nil {
		return 0, err
	}
	d := t.dl[:n*t.cut.classes]
	loss := t.obj.loss(logits, n, d)
	dy := t.relu.Backward(t.net.BackwardStage(t.cut.rest, d))
	if _, err := t.mlp.Backward(sctx, dy); err != nil {
		return 0, fmt.Errorf("tensor rank %d: %w", t.coord.shard, err)
	}
	after := t.group.Counts()
	sentAfter, _, _, _ := t.groupRing.Traffic()
	t.groupBytes += sentAfter - sentBefore
	t.trainSteps++
	t.counted.AllReduceOps += after.AllReduceOps - before.AllReduceOps
	t.counted.AllReduceValues += after.AllReduceValues - before.AllReduceValues
	t.counted.AllGatherOps += after.AllGatherOps - before.AllGatherOps + after.BroadcastOps - before.BroadcastOps
	t.formulaOps++
	t.formulaValues += int64(n * t.cut.out)
	return loss, nil
}

func (t *tensorTask) step(ctx context.Context, grads, params []float32) error {
	return t.stepAll(ctx, [][]float32{t.mlp.Params(), params}, [][]float32{t.mlp.Grads(), grads}, []optim.Stepper{t.mlpOpt, t.netOpt})
}

func (t *tensorTask) completed(ctx context.Context, epoch int, at position) error {
	t.flushBytes(t.env)
	if err := t.checkpoint(ctx, epoch, at); err != nil {
		return err
	}
	if at.epoch > epoch || at.step >= t.total {
		return t.wholeChecksum(ctx)
	}
	return nil
}

func (t *tensorTask) stopped(context.Context, position) {}

// tensorForwarder runs evaluation batches through a replica's tensor
// ranks together (every rank gets the whole logits); the first error is
// kept, and the rest of the pass computes nothing.
type tensorForwarder struct {
	t     *tensorTask
	ctx   context.Context
	err   error
	zeros []float32
}

func (f *tensorForwarder) InputSize() int { return f.t.cut.in }

func (f *tensorForwarder) Forward(x []float32, batch int, _ bool) []float32 {
	if f.err == nil {
		ctx, cancel := context.WithTimeout(f.ctx, f.t.timeout)
		logits, err := f.t.forward(ctx, x, batch, false)
		cancel()
		if err == nil {
			return logits
		}
		f.err = err
	}
	if cap(f.zeros) < batch*f.t.cut.classes {
		f.zeros = make([]float32, batch*f.t.cut.classes)
	}
	return f.zeros[:batch*f.t.cut.classes]
}

// evaluate implements synchronizer: replica 0's tensor ranks run the
// test split together through the objective's evaluation; rank 0
// reports.
func (t *tensorTask) evaluate(ctx context.Context, rank int32, _ forwarder, res *pb.JobResult, run func(forwarder, *pb.JobResult) error) (bool, error) {
	if t.coord.replica != 0 {
		return false, nil
	}
	f := &tensorForwarder{t: t, ctx: ctx}
	err := run(f, res)
	if err == nil {
		err = f.err
	}
	if err != nil {
		return false, fmt.Errorf("tensor rank %d: evaluating: %w", t.coord.shard, err)
	}
	return rank == 0, nil
}

func (t *tensorTask) checksum([]float32) uint64 { return t.sum }

func (t *tensorTask) stats() syncStats {
	var st syncStats
	if t.groupRing != nil {
		_, st.leftWait = t.groupRing.WaitStats()
	}
	return st
}

func (t *tensorTask) close() {
	t.report()
	t.meshGroup.close()
}

// gatherPair returns the whole fc1 and fc2 of the shards' buffers bufs
// (each laid out as the MLP's Params), flat in the model's order.
func (t *tensorTask) gatherPair(ctx context.Context, bufs ...[]float32) ([][]float32, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	out := make([][]float32, len(bufs))
	for i, b := range bufs {
		w, err := t.mlp.Gather(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("tensor rank %d: gathering fc1 and fc2: %w", t.coord.shard, err)
		}
		out[i] = flatPair(w)
	}
	return out, nil
}

func (t *tensorTask) wholeChecksum(ctx context.Context) error {
	p, err := t.gatherPair(ctx, t.mlp.Params())
	if err != nil {
		return err
	}
	c := models.NewChecksummer()
	c.Add(p[0])
	c.Add(t.net.Params())
	t.sum = c.Sum()
	return nil
}

func (t *tensorTask) checkpoint(ctx context.Context, epoch int, at position) error {
	if t.ckpt == nil || t.coord.replica != 0 || !jobspec.CheckpointDue(t.spec, at.step, at.epoch > epoch, epoch, 0) {
		return nil
	}
	mlpParts, netParts := optimParts(t.mlpOpt), optimParts(t.netOpt)
	if len(mlpParts) != len(netParts) {
		return fmt.Errorf("tensor rank %d: %d optimiser buffers for fc1 and fc2, %d for the rest", t.coord.shard, len(mlpParts), len(netParts))
	}
	pair, err := t.gatherPair(ctx, append([][]float32{t.mlp.Params()}, mlpParts...)...)
	if err != nil || t.a.Rank != 0 {
		return err
	}
	params := slices.Concat(pair[0], t.net.Params()) // fc1 and fc2 first, then the rest
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: t.ckpt.jobID, SpecHash: specHash(t.spec), Step: at.step, Epoch: at.epoch,
			EpochConsumed: at.consumed, WorldSize: t.ckpt.world, Seed: t.spec.GetSeed()},
		Tensors:   map[string]models.Tensor{},
		ModelMeta: t.ckpt.meta,
	}
	for _, g := range t.net.WholeSegments() {
		st.Tensors[g.Name] = models.F32Tensor(g.Shape, params[g.Offset:g.Offset+g.Len])
	}
	var parts [][]float32
	for i, b := range netParts {
		parts = append(parts, slices.Concat(pair[1+i], b))
	}
	st.CaptureOptimizer(wholeOptimizer(t.spec, t.netOpt, parts), t.net.WholeSegments())
	path, err := checkpoint.Save(t.ckpt.dir, st, int(t.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	t.ckpt.lastSave = time.Now()
	t.env.log.Debug("checkpoint written", "job", t.a.JobId, "path", path)
	return nil
}

// restore loads a whole-model checkpoint: the replicated part into the
// network, this rank's shard of fc1 and fc2 (and of their optimiser
// state) into the MLP.
func (t *tensorTask) restore(st *checkpoint.State) error {
	if err := restoreCheckpoint(checkpointPart(st, segNames(t.net.Segments()), segNames(t.net.BufferSegments())), t.a.ResumeFrom, t.spec, t.net, t.netOpt); err != nil {
		return err
	}
	pn, _, err := models.NewStage(t.spec.Model, t.net.Options(), 2, models.Balance{Boundaries: []string{t.cut.boundary}}, 0)
	if err != nil {
		return err
	}
	defer pn.Close()
	o := optim.FromSpec(t.spec)
	if err := restoreCheckpoint(checkpointPart(st, segNames(pn.Segments()), nil), t.a.ResumeFrom, t.spec, pn, o); err != nil {
		return err
	}
	if err := t.mlp.SetFromFull(t.pairWeights(pn.Params())); err != nil {
		return err
	}
	shard := func(whole []float32) ([]float32, error) {
		dst := make([]float32, len(t.mlp.Params()))
		return dst, t.mlp.ShardOf(dst, t.pairWeights(whole))
	}
	switch o := o.(type) {
	case *optim.SGD:
		if b := o.State(); b != nil {
			s, err := shard(b)
			if err != nil {
				return err
			}
			t.mlpOpt.(*optim.SGD).SetState(s)
		}
	case *optim.Adam:
		m, v, steps := o.State()
		if m == nil {
			t.mlpOpt.(*optim.Adam).SetState(nil, nil, steps)
			break
		}
		sm, err := shard(m)
		if err != nil {
			return err
		}
		sv, err := shard(v)
		if err != nil {
			return err
		}
		t.mlpOpt.(*optim.Adam).SetState(sm, sv, steps)
	}
	return nil
}
