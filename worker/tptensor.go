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
// replica train on the same batch. The model is cut into a replicated
// stem (vit-tiny's patch embedding; none for mlp), the sharded layers
// (tensorUnit: each a Megatron pair of column- then row-parallel layers
// with its f/g all-reduces inside the replica's group) and the replicated
// rest (the Trainer's network: models.NewStage of that part alone).
//
//   - mlp (Flatten, fc1 784→256, ReLU, fc2 256→128, ReLU, fc3
//     128→classes): fc1 and fc2 are one tensorpar.MLP with ReLU, the 256
//     hidden units split over the T ranks; one all-reduce of b·128
//     values forward (g), none backward (fc1 is the network's first
//     layer: no input gradient, so f's all-reduce is not needed). The
//     ReLU after fc2 and fc3 are replicated.
//   - vit-tiny (patch_embed, blocks.0, blocks.1, norm, head): each
//     transformer block is a tensorpar.Block, its attention split by
//     heads and its MLP by hidden units (T must divide both: jobspec);
//     2 all-reduces of b·s·D values forward and 2 backward per block,
//     Megatron's four per layer. The patch embedding (with the class
//     token and position embedding), the blocks' layer norms, the final
//     norm and the head are replicated.
//
// The replicated parts' inputs and output gradients are the same on every
// rank of the replica (the all-reduces give every rank the same sums), so
// their gradients are too, as in Megatron, and nothing about them is
// communicated within the group. The replicas of a tensor rank average
// its gradients over a ring of their own; every rank steps its own
// optimisers (element-wise). Checkpoints and the checksum are the whole
// model's (each unit's shards gathered, the optimiser's state too).

// tensorCut is how a tensor-parallel job's model is cut: stages
// contiguous runs of blocks (models.Partition at bal), the sharded one
// second to last, the replicated rest last, and with three a replicated
// stem first.
type tensorCut struct {
	model        string
	bal          models.Balance
	stages       int
	sharded      models.Stage // whole-network offsets
	unitLen      []int        // each unit's whole parameters, in order, covering sharded
	in, classes  int
	hidden, out  int // mlp: fc1 → fc2's units
	vit          models.TransformerSizes
	tokens       int // vit-tiny: patches + the class token
	shardedIndex int
}

// rest is the index of the replicated rest's stage.
func (c tensorCut) rest() int { return c.stages - 1 }

// hasStem reports whether a replicated stem comes before the sharded
// layers.
func (c tensorCut) hasStem() bool { return c.stages == 3 }

// tensorCutOf cuts spec's model (jobspec.TensorModels).
func tensorCutOf(spec *pb.JobSpec, opt models.Options) (tensorCut, error) {
	c := tensorCut{model: spec.Model}
	var boundaries []string
	switch spec.Model {
	case "mlp":
		boundaries, c.hidden, c.out = []string{"fc3"}, 256, 128
	case "vit-tiny":
		boundaries, c.vit = []string{"blocks.0", "norm"}, models.ViTTiny()
	default:
		return tensorCut{}, fmt.Errorf("tensor parallelism: model %s is not split yet (allowed: %v)", spec.Model, jobspec.TensorModels)
	}
	c.bal, c.stages = models.Balance{Boundaries: boundaries}, len(boundaries)+1
	c.shardedIndex = c.stages - 2
	whole, err := models.New(spec.Model, opt)
	if err != nil {
		return tensorCut{}, err
	}
	defer whole.Close()
	parts, err := models.Partition(whole, c.stages, c.bal)
	if err != nil {
		return tensorCut{}, err
	}
	o := whole.Options()
	c.in, c.classes, c.sharded = o.Channels*o.Height*o.Width, o.Classes, parts[c.shardedIndex]
	switch spec.Model {
	case "mlp":
		c.unitLen = []int{c.hidden*c.in + c.hidden + c.out*c.hidden + c.out}
	case "vit-tiny":
		v := c.vit
		for _, g := range whole.Segments() {
			if g.Name == "pos_embed" {
				c.tokens = g.Shape[1]
			}
		}
		n := 4*v.D + (3*v.D*v.D + 3*v.D + v.D*v.D + v.D) + (v.MLP*v.D + v.MLP + v.D*v.MLP + v.D)
		for range v.Depth {
			c.unitLen = append(c.unitLen, n)
		}
	}
	n := 0
	for _, l := range c.unitLen {
		n += l
	}
	if n != c.sharded.ParamLen || c.model == "vit-tiny" && c.tokens == 0 {
		return tensorCut{}, fmt.Errorf("tensor parallelism: %s's sharded layers hold %d parameters, want %d", c.model, c.sharded.ParamLen, n)
	}
	return c, nil
}

// stage builds stage s of the cut alone (models.NewStage), with the whole
// model's initial values.
func (c tensorCut) stage(opt models.Options, s int) (*models.Network, error) {
	net, _, err := models.NewStage(c.model, opt, c.stages, c.bal, s)
	return net, err
}

// tensorRest builds a tensor-parallel rank's network: the model's
// replicated rest alone (mlp: fc3; vit-tiny: norm and head), with the
// whole model's initial values.
func tensorRest(spec *pb.JobSpec, opt models.Options) (*models.Network, error) {
	c, err := tensorCutOf(spec, opt)
	if err != nil {
		return nil, err
	}
	return c.stage(opt, c.rest())
}

// tensorUnit is one sharded layer group of a tensor rank: mlp's Megatron
// pair, or one vit-tiny transformer block. All ranks of the group call
// forward, backward and whole together.
type tensorUnit interface {
	params() []float32
	grads() []float32
	// forward returns the unit's output for x (n examples), the same on
	// every rank; backward adds this rank's parameter gradients and
	// returns the input's gradient (nil where none is needed).
	forward(ctx context.Context, x []float32, n int, train bool) ([]float32, error)
	backward(ctx context.Context, dy []float32) ([]float32, error)
	// whole returns the whole unit's tensors of buf (laid out as params:
	// the parameters or an optimiser's state), flat in the model's order,
	// gathered from the group; shardOf is its inverse for this rank.
	whole(ctx context.Context, buf []float32) ([]float32, error)
	shardOf(dst, whole []float32) error
	// formula is the group's all-reduces (operations, values) in a
	// training step of n examples.
	formula(n int) (ops, values int64)
}

// mlpUnit is mlp's fc1 and fc2 (tensorpar.MLP with ReLU, no input
// gradient) and the replicated ReLU after fc2.
type mlpUnit struct {
	m    *tensorpar.MLP
	relu models.ReLU
}

func (u *mlpUnit) params() []float32 { return u.m.Params() }
func (u *mlpUnit) grads() []float32  { return u.m.Grads() }

func (u *mlpUnit) forward(ctx context.Context, x []float32, n int, train bool) ([]float32, error) {
	y, err := u.m.Forward(ctx, x, n)
	if err != nil {
		return nil, err
	}
	return u.relu.Forward(y, n, train), nil
}

func (u *mlpUnit) backward(ctx context.Context, dy []float32) ([]float32, error) {
	return u.m.Backward(ctx, u.relu.Backward(dy))
}

// pairWeights views a flat buffer laid out as fc1 and fc2 (fc1.weight,
// fc1.bias, fc2.weight, fc2.bias) as MLPWeights.
func pairWeights(m *tensorpar.MLP, flat []float32) tensorpar.MLPWeights {
	n1, n2 := m.Hidden*m.In, m.Out*m.Hidden
	return tensorpar.MLPWeights{W1: flat[:n1], B1: flat[n1 : n1+m.Hidden], W2: flat[n1+m.Hidden : n1+m.Hidden+n2], B2: flat[n1+m.Hidden+n2:]}
}

func (u *mlpUnit) whole(ctx context.Context, buf []float32) ([]float32, error) {
	w, err := u.m.Gather(ctx, buf)
	if err != nil {
		return nil, fmt.Errorf("gathering fc1 and fc2: %w", err)
	}
	return slices.Concat(w.W1, w.B1, w.W2, w.B2), nil
}

func (u *mlpUnit) shardOf(dst, whole []float32) error {
	return u.m.ShardOf(dst, pairWeights(u.m, whole))
}

func (u *mlpUnit) formula(n int) (int64, int64) { return 1, int64(n * u.m.Out) }

// blockUnit is one vit-tiny transformer block (tensorpar.Block); the
// last block is followed by the class token's selection (post), which
// has no parameters and belongs to it as models' blocks do.
type blockUnit struct {
	b    *tensorpar.Block
	post *models.ClassToken // nil but after the last block
}

func (u *blockUnit) params() []float32 { return u.b.Params() }
func (u *blockUnit) grads() []float32  { return u.b.Grads() }

func (u *blockUnit) forward(ctx context.Context, x []float32, n int, train bool) ([]float32, error) {
	y, err := u.b.Forward(ctx, x, n)
	if err != nil || u.post == nil {
		return y, err
	}
	return u.post.Forward(y, n, train), nil
}

func (u *blockUnit) backward(ctx context.Context, dy []float32) ([]float32, error) {
	if u.post != nil {
		dy = u.post.Backward(dy)
	}
	return u.b.Backward(ctx, dy)
}

// blockWeights views a flat buffer laid out as a block's tensors in the
// model's order (norm1, attn.in_proj_weight, in_proj_bias,
// out_proj.weight, out_proj.bias, norm2, mlp.fc1, mlp.fc2) as
// BlockWeights.
func blockWeights(b *tensorpar.Block, flat []float32) tensorpar.BlockWeights {
	d, h := b.D, b.Hidden
	next := func(n int) []float32 {
		s := flat[:n:n]
		flat = flat[n:]
		return s
	}
	var w tensorpar.BlockWeights
	w.Norm1W, w.Norm1B = next(d), next(d)
	w.Attn = tensorpar.AttentionWeights{InW: next(3 * d * d), InB: next(3 * d), OutW: next(d * d), OutB: next(d)}
	w.Norm2W, w.Norm2B = next(d), next(d)
	w.MLP = tensorpar.MLPWeights{W1: next(h * d), B1: next(h), W2: next(d * h), B2: next(d)}
	return w
}

func (u *blockUnit) whole(ctx context.Context, buf []float32) ([]float32, error) {
	w, err := u.b.Gather(ctx, buf)
	if err != nil {
		return nil, fmt.Errorf("gathering a transformer block: %w", err)
	}
	a, m := w.Attn, w.MLP
	return slices.Concat(w.Norm1W, w.Norm1B, a.InW, a.InB, a.OutW, a.OutB, w.Norm2W, w.Norm2B, m.W1, m.B1, m.W2, m.B2), nil
}

func (u *blockUnit) shardOf(dst, whole []float32) error {
	return u.b.ShardOf(dst, blockWeights(u.b, whole))
}

func (u *blockUnit) formula(n int) (int64, int64) {
	return 4, 4 * int64(n*u.b.Tokens*u.b.D)
}

// tensorTask is a tensor-parallel job's synchronizer (see above).
type tensorTask struct {
	unscaled
	*meshGroup // the replica's T ranks (group), this tensor rank's D replicas
	a          *pb.Assignment
	env        *taskEnv
	obj        objective
	net        *models.Network // the replicated rest alone
	cut        tensorCut
	restStage  models.Stage

	stem      *models.Network // the replicated stem alone (vit-tiny); nil for mlp
	stemStage models.Stage
	stemOpt   optim.Stepper
	units     []tensorUnit
	unitOpts  []optim.Stepper
	netOpt    optim.Stepper
	ckpt      *checkpointer

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
	opt := net.Options()
	cut, err := tensorCutOf(spec, opt)
	if err != nil {
		return nil, err
	}
	held, restStage, ok := net.HeldStage()
	if !ok || held != cut.rest() {
		return nil, errors.New("tensor parallelism: the rank's network is not the model's replicated rest alone")
	}
	c := groupCoord(a, jobspec.TensorRanks(spec))
	b := int(spec.GetBatchSize())
	m, err := joinMesh(ctx, a, env, c, "tensor rank", "%s/tensor-%d", "%s/tensor-rank-%d", totalSteps)
	if err != nil {
		return nil, fmt.Errorf("tensor parallelism: %w", err)
	}
	t := &tensorTask{meshGroup: m, a: a, env: env, obj: obj, net: net, cut: cut, restStage: restStage,
		netOpt: optim.FromSpec(spec), x: make([]float32, b*cut.in), dl: make([]float32, b*cut.classes)}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if cut.hasStem() {
		if t.stem, err = cut.stage(opt, 0); err != nil {
			return nil, err
		}
		_, t.stemStage, _ = t.stem.HeldStage()
		t.stemOpt = optim.FromSpec(spec)
	}
	jctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	switch cut.model {
	case "mlp":
		mlp, err := tensorpar.NewMLPWith(jctx, t.group, cut.in, cut.hidden, cut.out, tensorpar.MLPOptions{ReLU: true, NoInputGrad: true})
		if err != nil {
			return nil, err
		}
		t.units = []tensorUnit{&mlpUnit{m: mlp}}
	case "vit-tiny":
		v := cut.vit
		for i := range v.Depth {
			blk, err := tensorpar.NewBlock(jctx, t.group, v.D, v.Heads, cut.tokens, v.MLP)
			if err != nil {
				return nil, err
			}
			u := &blockUnit{b: blk}
			if i == v.Depth-1 {
				u.post = &models.ClassToken{Tokens: cut.tokens, D: v.D}
			}
			t.units = append(t.units, u)
		}
	}
	for range t.units {
		t.unitOpts = append(t.unitOpts, optim.FromSpec(spec))
	}
	// The whole model's initial sharded layers (their stage alone), then
	// this rank's shards of them.
	sn, err := cut.stage(opt, cut.shardedIndex)
	if err != nil {
		return nil, err
	}
	defer sn.Close()
	if err := t.eachUnitOf(sn.Params(), func(u tensorUnit, whole []float32) error { return u.shardOf(u.params(), whole) }); err != nil {
		return nil, err
	}
	env.log.Debug("tensor rank ready", "job", a.JobId, "rank", a.Rank, "tensor_rank", c.shard, "tensor", c.shards,
		"replica", c.replica, "replicas", c.replicas, "model", cut.model, "sharded_params_held", t.shardedParams())
	return t, nil
}

// eachUnitOf calls fn with each unit and its part of flat, a buffer laid
// out as the sharded stage's whole parameters.
func (t *tensorTask) eachUnitOf(flat []float32, fn func(u tensorUnit, whole []float32) error) error {
	off := 0
	for i, u := range t.units {
		n := t.cut.unitLen[i]
		if err := fn(u, flat[off:off+n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// shardedParams is how many of the sharded layers' parameters this rank
// holds.
func (t *tensorTask) shardedParams() int {
	n := 0
	for _, u := range t.units {
		n += len(u.params())
	}
	return n
}

// pieces returns this rank's parameter and gradient buffers and their
// optimisers in the model's order: the stem's, each unit's, the rest's
// (params and grads, the Trainer's network's).
func (t *tensorTask) pieces(params, grads []float32) ([][]float32, [][]float32, []optim.Stepper) {
	var ps, gs [][]float32
	var opts []optim.Stepper
	if t.stem != nil {
		ps, gs, opts = append(ps, t.stem.Params()), append(gs, t.stem.Grads()), append(opts, t.stemOpt)
	}
	for i, u := range t.units {
		ps, gs, opts = append(ps, u.params()), append(gs, u.grads()), append(opts, t.unitOpts[i])
	}
	return append(ps, params), append(gs, grads), append(opts, t.netOpt)
}

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

// beginStep zeroes the gradients the Trainer does not (it zeroes its
// network's: the rest's).
func (t *tensorTask) beginStep(context.Context, []float32) (func(int), error) {
	if t.stem != nil {
		t.stem.ZeroGrad()
	}
	for _, u := range t.units {
		clear(u.grads())
	}
	return nil, nil
}

// forward runs batch n of x through the stem, the units (their
// all-reduces) and the rest, and returns the logits.
func (t *tensorTask) forward(ctx context.Context, x []float32, n int, train bool) ([]float32, error) {
	h := x
	if t.stem != nil {
		h = t.stem.ForwardStage(t.stemStage, x, n, train)
	}
	for _, u := range t.units {
		var err error
		if h, err = u.forward(ctx, h, n, train); err != nil {
			return nil, fmt.Errorf("tensor rank %d: %w", t.coord.shard, err)
		}
	}
	return t.net.ForwardStage(t.restStage, h, n, train), nil
}

// backward back-propagates the logits' gradient d through the rest, the
// units (their all-reduces) and the stem.
func (t *tensorTask) backward(ctx context.Context, d []float32) error {
	d = t.net.BackwardStage(t.restStage, d)
	for i := len(t.units) - 1; i >= 0; i-- {
		var err error
		if d, err = t.units[i].backward(ctx, d); err != nil {
			return fmt.Errorf("tensor rank %d: %w", t.coord.shard, err)
		}
	}
	if t.stem != nil {
		t.stem.BackwardStage(t.stemStage, d)
	}
	return nil
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
	if err := t.backward(sctx, d); err != nil {
		return 0, err
	}
	after := t.group.Counts()
	sentAfter, _, _, _ := t.groupRing.Traffic()
	t.groupBytes += sentAfter - sentBefore
	t.trainSteps++
	t.counted.AllReduceOps += after.AllReduceOps - before.AllReduceOps
	t.counted.AllReduceValues += after.AllReduceValues - before.AllReduceValues
	t.counted.AllGatherOps += after.AllGatherOps - before.AllGatherOps + after.BroadcastOps - before.BroadcastOps
	for _, u := range t.units {
		ops, values := u.formula(n)
		t.formulaOps += ops
		t.formulaValues += values
	}
	return loss, nil
}

func (t *tensorTask) step(ctx context.Context, grads, params []float32) error {
	ps, gs, opts := t.pieces(params, grads)
	return t.stepAll(ctx, ps, gs, opts)
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
	if t.stem != nil {
		t.stem.Close()
	}
	t.meshGroup.close()
}

// wholeOf returns, for each of bufs (buffers laid out as the pieces —
// the parameters, or an optimiser's state: bufs[i][j] is piece j's),
// the whole model's flat buffer: the units' shards gathered, the
// replicated pieces as they are. Every rank of the group calls it.
func (t *tensorTask) wholeOf(ctx context.Context, bufs ...[][]float32) ([][]float32, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	first := 0
	if t.stem != nil {
		first = 1
	}
	out := make([][]float32, len(bufs))
	for i, b := range bufs {
		parts := slices.Clone(b)
		for j, u := range t.units {
			w, err := u.whole(ctx, b[first+j])
			if err != nil {
				return nil, fmt.Errorf("tensor rank %d: %w", t.coord.shard, err)
			}
			parts[first+j] = w
		}
		out[i] = slices.Concat(parts...)
	}
	return out, nil
}

func (t *tensorTask) wholeChecksum(ctx context.Context) error {
	ps, _, _ := t.pieces(t.net.Params(), nil)
	p, err := t.wholeOf(ctx, ps)
	if err != nil {
		return err
	}
	t.sum = models.Checksum(p[0])
	return nil
}

func (t *tensorTask) checkpoint(ctx context.Context, epoch int, at position) error {
	if t.ckpt == nil || t.coord.replica != 0 || !jobspec.CheckpointDue(t.spec, at.step, at.epoch > epoch, epoch, 0) {
		return nil
	}
	ps, _, opts := t.pieces(t.net.Params(), nil)
	bufs := [][][]float32{ps}
	nstate := len(optimParts(t.netOpt))
	for i := range nstate {
		state := make([][]float32, len(opts))
		for j, o := range opts {
			parts := optimParts(o)
			if len(parts) != nstate {
				return fmt.Errorf("tensor rank %d: %d optimiser buffers for piece %d of the model, %d for the rest", t.coord.shard, len(parts), j, nstate)
			}
			state[j] = parts[i]
		}
		bufs = append(bufs, state)
	}
	whole, err := t.wholeOf(ctx, bufs...)
	if err != nil || t.a.Rank != 0 {
		return err
	}
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: t.ckpt.jobID, SpecHash: specHash(t.spec), Step: at.step, Epoch: at.epoch,
			EpochConsumed: at.consumed, WorldSize: t.ckpt.world, Seed: t.spec.GetSeed()},
		Tensors:   map[string]models.Tensor{},
		ModelMeta: t.ckpt.meta,
	}
	for _, g := range t.net.WholeSegments() {
		st.Tensors[g.Name] = models.F32Tensor(g.Shape, whole[0][g.Offset:g.Offset+g.Len])
	}
	st.CaptureOptimizer(wholeOptimizer(t.spec, t.netOpt, whole[1:]), t.net.WholeSegments())
	path, err := checkpoint.Save(t.ckpt.dir, st, int(t.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	t.ckpt.lastSave = time.Now()
	t.env.log.Debug("checkpoint written", "job", t.a.JobId, "path", path)
	return nil
}

// restore loads a whole-model checkpoint: the replicated parts into the
// rest's and the stem's networks, this rank's shard of each unit (and of
// its optimiser state) into the unit.
func (t *tensorTask) restore(st *checkpoint.State) error {
	load := func(net *models.Network, o optim.Stepper) error {
		return restoreCheckpoint(checkpointPart(st, segNames(net.Segments()), segNames(net.BufferSegments())), t.a.ResumeFrom, t.spec, net, o)
	}
	if err := load(t.net, t.netOpt); err != nil {
		return err
	}
	if t.stem != nil {
		if err := load(t.stem, t.stemOpt); err != nil {
			return err
		}
	}
	sn, err := t.cut.stage(t.net.Options(), t.cut.shardedIndex)
	if err != nil {
		return err
	}
	defer sn.Close()
	o := optim.FromSpec(t.spec)
	if err := load(sn, o); err != nil {
		return err
	}
	if err := t.eachUnitOf(sn.Params(), func(u tensorUnit, whole []float32) error { return u.shardOf(u.params(), whole) }); err != nil {
		return err
	}
	// The optimiser's state of the sharded stage, each unit's shard.
	shards := func(whole []float32) ([][]float32, error) {
		var out [][]float32
		err := t.eachUnitOf(whole, func(u tensorUnit, w []float32) error {
			dst := make([]float32, len(u.params()))
			out = append(out, dst)
			return u.shardOf(dst, w)
		})
		return out, err
	}
	switch o := o.(type) {
	case *optim.SGD:
		if b := o.State(); b != nil {
			s, err := shards(b)
			if err != nil {
				return err
			}
			for i, uo := range t.unitOpts {
				uo.(*optim.SGD).SetState(s[i])
			}
		}
	case *optim.Adam:
		m, v, steps := o.State()
		if m == nil {
			for _, uo := range t.unitOpts {
				uo.(*optim.Adam).SetState(nil, nil, steps)
			}
			break
		}
		sm, err := shards(m)
		if err != nil {
			return err
		}
		sv, err := shards(v)
		if err != nil {
			return err
		}
		for i, uo := range t.unitOpts {
			uo.(*optim.Adam).SetState(sm[i], sv[i], steps)
		}
	}
	return nil
}
