package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/eval"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/tensorpar"
)

// A label-sharded job (parallelism.label_shards L, workers = D × L) puts
// rank r on label shard r mod L of data replica r / L. The L ranks of a
// replica train on the same batch: each holds the whole body (the model
// but its last block, built alone by models.NewStage) and the rows of the
// classifier head for its classes (tensorpar.Head). Why a replicated body
// rather than Partial FC's data-parallel body with gathered features: it
// is exact — the body's forward, dropout masks and batch-norm statistics
// are the single worker's, bit for bit, and only the head's products and
// the softmax's reductions are split — with the fewest collectives (3
// all-reduces of b values for the loss, one of b·In for the features'
// gradient, and no all-gather of features and reduce-scatter of their
// gradients), and it needs no change to the body's layers. It costs L
// times the body's compute per image: it is for heads that dominate
// (many classes); Partial FC's body is the next step where they do not.
//
// The body's gradient is the same on the L ranks of a replica (the
// features' gradient is all-reduced over them), so it is only averaged
// over the D replicas, together with the head shard's, over a ring of the
// ranks that hold the same shard. Every rank then steps its own
// optimiser over its body and its head rows (both element-wise: SGD and
// Adam step a split buffer as the whole one).
//
// No rank materialises all logits in training or evaluation (Predict's
// arg-max, the loss from the shards). The whole head is gathered (one
// all-gather over the replica's ranks) for the checksum after an epoch and
// at the end, and by replica 0 for checkpoints, which are the whole
// model's tensors under PyTorch's names, as any job's.

// labelCoord is a rank's place on a label-sharded job's mesh.
type labelCoord struct {
	shard, shards     int // label shard, L
	replica, replicas int // data replica, D
}

func labelCoordOf(a *pb.Assignment) labelCoord { return groupCoord(a, jobspec.LabelShards(a.Spec)) }

// groupCoord places a rank on a mesh of data replicas of l ranks each
// (label shards, tensor ranks): rank r is r mod l of replica r / l.
func groupCoord(a *pb.Assignment, l int) labelCoord {
	r := int(a.Rank)
	return labelCoord{shard: r % l, shards: l, replica: r / l, replicas: int(a.WorldSize) / l}
}

// rank is the job rank of shard s of replica d.
func (c labelCoord) rank(d, s int) int { return d*c.shards + s }

// labelBody builds a label-sharded rank's network: the model's body alone
// (stage 0 of the cut before its head, models.NewStage), with the whole
// model's initial values.
func labelBody(spec *pb.JobSpec, opt models.Options) (*models.Network, error) {
	lh, err := labelHead(spec, opt)
	if err != nil {
		return nil, err
	}
	net, _, err := models.NewStage(spec.Model, opt, 2, jobspec.LabelHeadBalance(lh), 0)
	return net, err
}

// labelHead finds where spec's model's head starts (a whole network is
// built, then dropped: Blocks needs one).
func labelHead(spec *pb.JobSpec, opt models.Options) (jobspec.LabelHead, error) {
	whole, err := models.New(spec.Model, opt)
	if err != nil {
		return jobspec.LabelHead{}, err
	}
	defer whole.Close()
	return jobspec.LabelHeadOf(whole)
}

// labelTask is a label-sharded job's synchronizer (see above).
type labelTask struct {
	unscaled
	*meshGroup // the replica's L ranks (group), this shard's D replicas
	a          *pb.Assignment
	env        *taskEnv
	obj        *classification
	net        *models.Network // the body alone
	lh         jobspec.LabelHead
	classes    int

	head    *tensorpar.Head
	hp, hg  []float32 // the head's rows: [W (k, In) | b (k)], parameters and gradients
	bodyOpt optim.Stepper
	headOpt optim.Stepper
	ckpt    *checkpointer // nil: the job writes none

	x   []float32
	sum uint64 // the whole model's checksum when last computed

	counts labelCounts // the training steps' communication (tpstats.go)
}

// newLabelTask joins the replica's label group and this shard's replica
// ring and builds this rank's head rows from the whole model's initial
// head.
func newLabelTask(ctx context.Context, a *pb.Assignment, env *taskEnv, net *models.Network, obj objective, totalSteps int64) (_ *labelTask, err error) {
	spec := a.Spec
	cls, ok := obj.(*classification)
	if !ok {
		return nil, fmt.Errorf("label shards: the job's data set is not single-label classification (%T)", obj)
	}
	lh, err := jobspec.LabelHeadOf(net)
	if err != nil {
		return nil, err
	}
	if held, st, ok := net.HeldStage(); !ok || held != 0 || st.End != lh.Body.End {
		return nil, errors.New("label shards: the rank's network is not the model's body alone")
	}
	shards, err := jobspec.LabelShardClasses(spec)
	if err != nil {
		return nil, err
	}
	c := labelCoordOf(a)
	m, err := joinMesh(ctx, a, env, c, "label shard", "%s/labels-%d", "%s/label-shard-%d", totalSteps)
	if err != nil {
		return nil, fmt.Errorf("label shards: %w", err)
	}
	t := &labelTask{meshGroup: m, a: a, env: env, obj: cls, net: net, lh: lh, classes: net.Options().Classes,
		bodyOpt: optim.FromSpec(spec), headOpt: optim.FromSpec(spec),
		x: make([]float32, int(spec.GetBatchSize())*net.InputSize())}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if t.head, err = tensorpar.NewHead(t.group, lh.In, t.classes, shards); err != nil {
		return nil, err
	}
	// The head's rows in one flat buffer each, for the optimiser.
	k, in := len(t.head.Owned), lh.In
	t.hp, t.hg = make([]float32, k*(in+1)), make([]float32, k*(in+1))
	lin := t.head.Lin
	lin.W, lin.B = t.hp[:k*in:k*in], t.hp[k*in:]
	lin.DW, lin.DB = t.hg[:k*in:k*in], t.hg[k*in:]
	// The whole model's initial head (its stage alone), then this
	// rank's rows of it.
	hn, _, err := models.NewStage(spec.Model, net.Options(), 2, jobspec.LabelHeadBalance(lh), 1)
	if err != nil {
		return nil, err
	}
	w := hn.Params()
	t.head.SetFromFull(w[:t.classes*in], w[t.classes*in:])
	hn.Close()
	env.log.Debug("label shard ready", "job", a.JobId, "rank", a.Rank, "shard", c.shard, "shards", c.shards,
		"replica", c.replica, "replicas", c.replicas, "classes", len(t.head.Owned), "head", lh.Head.Blocks[0].Name)
	return t, nil
}

func (t *labelTask) start(ctx context.Context, from resumeFrom) (origin, error) {
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

func (t *labelTask) beginStep(context.Context, []float32) (func(int), error) {
	clear(t.hg)
	return nil, nil
}

// gradient implements synchronizer: the body forward, this rank's logits,
// the loss from the shards, the head's backward (the features' gradient
// all-reduced over the replica's shards) and the body's backward.
func (t *labelTask) gradient(ctx context.Context, _ int64, epoch int, batch []int, _ func() (float32, error)) (float32, error) {
	n := len(batch)
	if n == 0 {
		return 0, nil
	}
	x := t.x[:n*t.net.InputSize()]
	if err := t.obj.batch(batch, x, epoch); err != nil {
		return 0, err
	}
	sctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	before := t.group.Counts()
	sentBefore, _, _, _ := t.groupRing.Traffic()
	feats := t.net.ForwardStage(t.lh.Body, x, n, true)
	t.head.Forward(feats, n)
	loss, err := tensorpar.Loss(sctx, t.head, t.obj.y[:n], models.CEOptions{})
	if err != nil {
		return 0, fmt.Errorf("label shard %d: the loss: %w", t.coord.shard, err)
	}
	dx, err := t.head.Backward(sctx)
	if err != nil {
		return 0, fmt.Errorf("label shard %d: the features' gradient: %w", t.coord.shard, err)
	}
	t.net.BackwardStage(t.lh.Body, dx)
	sentAfter, _, _, _ := t.groupRing.Traffic()
	t.counts.add(n, t.lh.In, t.coord.shards, before, t.group.Counts(), sentBefore, sentAfter)
	return loss, nil
}

// step averages the body's and the head rows' gradients over the D
// replicas and steps both optimisers.
func (t *labelTask) step(ctx context.Context, grads, params []float32) error {
	return t.stepAll(ctx, [][]float32{params, t.hp}, [][]float32{grads, t.hg}, []optim.Stepper{t.bodyOpt, t.headOpt})
}

// completed writes a checkpoint when one is due, and after an epoch and
// after the last step computes the whole model's checksum.
func (t *labelTask) completed(ctx context.Context, epoch int, at position) error {
	t.flushBytes(t.env)
	if err := t.checkpoint(ctx, epoch, at); err != nil {
		return err
	}
	if at.epoch > epoch || at.step >= t.total {
		return t.wholeChecksum(ctx)
	}
	return nil
}

func (t *labelTask) stopped(context.Context, position) {}

// evaluate implements synchronizer: replica 0's ranks run the test split
// through the body and their head rows together; the loss comes from the
// shards and the predictions from Predict's arg-max, so no rank holds all
// logits. Rank 0 reports.
func (t *labelTask) evaluate(ctx context.Context, rank int32, _ forwarder, res *pb.JobResult, _ func(forwarder, *pb.JobResult) error) (bool, error) {
	if t.coord.replica != 0 {
		return false, nil
	}
	test := t.obj.test
	conf := eval.NewConfusion(t.classes)
	in := t.net.InputSize()
	x := make([]float32, evalBatch*in)
	y := make([]int32, evalBatch)
	idx := make([]int, evalBatch)
	var lossSum float64
	for lo := 0; lo < test.Len(); lo += evalBatch {
		k := min(evalBatch, test.Len()-lo)
		for i := range k {
			idx[i] = lo + i
		}
		test.Batch(idx[:k], x[:k*in], y[:k])
		if err := t.evalBatch(ctx, x[:k*in], y[:k], conf, &lossSum); err != nil {
			return false, fmt.Errorf("label shard %d: evaluating: %w", t.coord.shard, err)
		}
	}
	res.TestLoss = lossSum / float64(test.Len())
	fillConfusion(res, conf)
	return rank == 0, nil
}

func (t *labelTask) evalBatch(ctx context.Context, x []float32, y []int32, conf *eval.Confusion, lossSum *float64) error {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	k := len(y)
	t.head.Forward(t.net.ForwardStage(t.lh.Body, x, k, false), k)
	loss, err := tensorpar.Loss(ctx, t.head, y, models.CEOptions{})
	if err != nil {
		return err
	}
	*lossSum += float64(loss) * float64(k)
	pred, err := tensorpar.Predict(ctx, t.head)
	if err != nil {
		return err
	}
	conf.AddPredictionsWide(pred, y)
	return nil
}

// checksum implements synchronizer: the whole model's, computed with the
// replica's other shards after the last step (params hold the body alone).
func (t *labelTask) checksum([]float32) uint64 { return t.sum }

func (t *labelTask) stats() syncStats {
	var st syncStats
	if t.groupRing != nil {
		_, st.leftWait = t.groupRing.WaitStats()
	}
	return st
}

func (t *labelTask) close() {
	t.report()
	t.meshGroup.close()
}

// gatherHead all-gathers the replica's head rows — with optimiser
// buffers parts too (each of the head's rows' length, as hp) — and
// returns the whole head's [W (Classes, In) | b (Classes)] for each of
// them, parameters first. One all-gather over the label group, of the
// longest shard's rows padded.
func (t *labelTask) gatherHead(ctx context.Context, parts [][]float32) ([][]float32, error) {
	in, l := t.lh.In, t.coord.shards
	all, err := jobspec.LabelShardClasses(t.spec)
	if err != nil {
		return nil, err
	}
	longest := 0
	for _, s := range all {
		longest = max(longest, len(s))
	}
	bufs := append([][]float32{t.hp}, parts...)
	per := longest * (in + 1)
	mine := make([]float32, len(bufs)*per)
	for i, b := range bufs {
		copy(mine[i*per:], b)
	}
	got := make([]float32, l*len(mine))
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	if err := t.group.AllGather(ctx, got, mine); err != nil {
		return nil, fmt.Errorf("label shard %d: gathering the head: %w", t.coord.shard, err)
	}
	out := make([][]float32, len(bufs))
	for i := range bufs {
		whole := make([]float32, t.classes*(in+1))
		for q, owned := range all {
			src := got[q*len(mine)+i*per:]
			k := len(owned)
			for j, c := range owned {
				copy(whole[c*in:(c+1)*in], src[j*in:(j+1)*in])
				whole[t.classes*in+c] = src[k*in+j]
			}
		}
		out[i] = whole
	}
	return out, nil
}

// rowsOf is this rank's rows [W (k, In) | b (k)] of a whole head's
// [W (Classes, In) | b (Classes)].
func (t *labelTask) rowsOf(whole []float32) []float32 {
	in, k := t.lh.In, len(t.head.Owned)
	out := make([]float32, k*(in+1))
	for j, c := range t.head.Owned {
		copy(out[j*in:(j+1)*in], whole[c*in:(c+1)*in])
		out[k*in+j] = whole[t.classes*in+c]
	}
	return out
}

// wholeChecksum computes the whole model's parameter checksum
// (models.Checksum of its flat buffer: the body's, then the head's).
func (t *labelTask) wholeChecksum(ctx context.Context) error {
	h, err := t.gatherHead(ctx, nil)
	if err != nil {
		return err
	}
	c := models.NewChecksummer()
	c.Add(t.net.Params())
	c.Add(h[0])
	t.sum = c.Sum()
	return nil
}

// checkpoint writes the job's checkpoint of the state at at when one is
// due: replica 0's shards gather the head and its optimiser state, and
// rank 0 writes the whole model's tensors.
func (t *labelTask) checkpoint(ctx context.Context, epoch int, at position) error {
	if t.ckpt == nil || t.coord.replica != 0 || !jobspec.CheckpointDue(t.spec, at.step, at.epoch > epoch, epoch, 0) {
		return nil
	}
	bodyParts, headParts := optimParts(t.bodyOpt), optimParts(t.headOpt)
	if len(bodyParts) != len(headParts) {
		return fmt.Errorf("label shard %d: %d optimiser buffers for the body, %d for the head", t.coord.shard, len(bodyParts), len(headParts))
	}
	h, err := t.gatherHead(ctx, headParts)
	if err != nil || t.a.Rank != 0 {
		return err
	}
	whole := func(body, head []float32) []float32 {
		return slices.Concat(body, head) // the head is the model's last block
	}
	params := whole(t.net.Params(), h[0])
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: t.ckpt.jobID, SpecHash: specHash(t.spec), Step: at.step, Epoch: at.epoch,
			EpochConsumed: at.consumed, WorldSize: t.ckpt.world, Seed: t.spec.GetSeed()},
		Tensors:   map[string]models.Tensor{},
		ModelMeta: t.ckpt.meta,
	}
	for _, g := range t.net.WholeSegments() {
		st.Tensors[g.Name] = models.F32Tensor(g.Shape, params[g.Offset:g.Offset+g.Len])
	}
	for _, g := range t.net.BufferSegments() {
		st.Tensors[g.Name] = models.F32Tensor(g.Shape, t.net.Buffers()[g.Offset:g.Offset+g.Len])
	}
	var parts [][]float32
	for i, b := range bodyParts {
		parts = append(parts, whole(b, h[1+i]))
	}
	st.CaptureOptimizer(wholeOptimizer(t.spec, t.bodyOpt, parts), t.net.WholeSegments())
	path, err := checkpoint.Save(t.ckpt.dir, st, int(t.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	t.ckpt.lastSave = time.Now()
	t.env.log.Debug("checkpoint written", "job", t.a.JobId, "path", path)
	return nil
}

// restore loads a whole-model checkpoint: the body's tensors and
// optimiser state into the body, this rank's rows of the head's into the
// head.
func (t *labelTask) restore(st *checkpoint.State) error {
	partOf := func(params, bufs map[string]bool) *checkpoint.State { return checkpointPart(st, params, bufs) }
	if err := restoreCheckpoint(partOf(segNames(t.net.Segments()), segNames(t.net.BufferSegments())), t.a.ResumeFrom, t.spec, t.net, t.bodyOpt); err != nil {
		return err
	}
	// The head: a whole head's network (its stage alone) and optimiser
	// read it, and this rank keeps its rows.
	hn, _, err := models.NewStage(t.spec.Model, t.net.Options(), 2, jobspec.LabelHeadBalance(t.lh), 1)
	if err != nil {
		return err
	}
	defer hn.Close()
	o := optim.FromSpec(t.spec)
	if err := restoreCheckpoint(partOf(segNames(hn.Segments()), nil), t.a.ResumeFrom, t.spec, hn, o); err != nil {
		return err
	}
	copy(t.hp, t.rowsOf(hn.Params()))
	switch o := o.(type) {
	case *optim.SGD:
		if b := o.State(); b != nil {
			t.headOpt.(*optim.SGD).SetState(t.rowsOf(b))
		}
	case *optim.Adam:
		m, v, steps := o.State()
		if m != nil {
			t.headOpt.(*optim.Adam).SetState(t.rowsOf(m), t.rowsOf(v), steps)
		} else {
			t.headOpt.(*optim.Adam).SetState(nil, nil, steps)
		}
	}
	return nil
}

// segNames is the set of segs' names.
func segNames(segs []models.Segment) map[string]bool {
	m := map[string]bool{}
	for _, g := range segs {
		m[g.Name] = true
	}
	return m
}

// checkpointPart is st restricted to the tensors named in params and
// bufs and the optimiser state of params (a network that holds part of
// the model loads it).
func checkpointPart(st *checkpoint.State, params, bufs map[string]bool) *checkpoint.State {
	part := *st
	part.Tensors = map[string]models.Tensor{}
	for name, v := range st.Tensors {
		if params[name] || bufs[name] {
			part.Tensors[name] = v
		}
	}
	part.Optim = map[string]models.Tensor{}
	for name, v := range st.Optim {
		for _, prefix := range []string{checkpoint.MomentumPrefix, checkpoint.AdamMPrefix, checkpoint.AdamVPrefix} {
			if strings.HasPrefix(name, prefix) && params[strings.TrimPrefix(name, prefix)] {
				part.Optim[name] = v
			}
		}
	}
	return &part
}
