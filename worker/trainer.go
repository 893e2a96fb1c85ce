package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Trainer trains one rank of a ps or ring job over its synchronizer:
// resume places it where its generation starts; every epoch deals this
// rank its share of the epoch's sample order; every step computes the
// gradient of its batch, hands it to the synchronizer for the job's next
// parameters and tells the synchronizer the step is complete; progress
// goes to the coordinator every log_every_steps, and the job evaluates on
// the test split (rank 0, or a pipeline's stages together: the
// synchronizer decides) after every epoch (eval_every_epoch) and at the end. It
// holds no mode-specific code: that is all behind the synchronizer.
//
// A Trainer is used by the one goroutine that runs its task.
type Trainer struct {
	a       *pb.Assignment
	spec    *pb.JobSpec
	env     *taskEnv
	obj     objective
	net     *models.Network
	sampler *data.Sampler
	plan    stepPlan
	micro   int               // examples per forward/backward pass (batch / grad_accum_steps)
	ckpt    *checkpoint.State // the checkpoint the assignment resumes from; nil: none
	sync    synchronizer      // set by join (or a test)

	from  position // where this task started training (after resume)
	at    position // where training stands: after the last completed step
	total int64    // the step count at which training ends

	x, dl    []float32 // one micro-batch's inputs and loss gradients
	epochIdx []int     // this rank's share of an epoch's order

	res        *pb.JobResult
	times      *stepTimes
	start      time.Time
	lastReport time.Time
	lossSum    float64 // since the last progress report
	lossN      int
	images     int
	evaluated  bool             // the parameters after the last step have been evaluated
	lastLoader data.LoaderStats // streamed data: the loader's totals at the last report
	layers     *layerTrace      // records the steps' timeline (env.trace); nil: none
}

// newTrainer builds the model and the step plan of a task and reads the
// checkpoint it resumes from, if any; join then connects it to the job.
func newTrainer(a *pb.Assignment, env *taskEnv, obj objective) (*Trainer, error) {
	spec := a.Spec
	opt := obj.shape()
	opt.Seed = spec.GetSeed()
	net, err := newNetwork(a, opt) // a pipeline stage's rank builds its stage alone
	if err != nil {
		return nil, err
	}
	if int64(net.WholeParams()) != a.NumParams {
		net.Close()
		return nil, fmt.Errorf("model %s has %d parameters here but %d on the coordinator", spec.Model, net.WholeParams(), a.NumParams)
	}
	rank, world, err := dataShard(a)
	if err != nil {
		return nil, err
	}
	sampler, err := data.NewSampler(obj.trainLen(), rank, world, spec.GetSeed(), true, false)
	if err != nil {
		return nil, err
	}
	bs := jobspec.StepBatch(spec)
	micro := int(spec.GetBatchSize())
	t := &Trainer{a: a, spec: spec, env: env, obj: obj, net: net, sampler: sampler, micro: micro,
		plan: stepPlan{trainLen: obj.trainLen(), world: world, batch: bs, perEpoch: sampler.NumBatches(bs),
			epochs: int(spec.GetEpochs()), maxSteps: spec.MaxSteps},
		x: make([]float32, micro*net.InputSize()), dl: make([]float32, micro*opt.Classes), epochIdx: make([]int, sampler.Len()),
	}
	if a.ResumeFrom != "" {
		st, err := checkpoint.Load(a.ResumeFrom)
		if err != nil {
			return nil, err
		}
		t.ckpt = st
		t.at = position{step: st.Meta.Step, epoch: st.Meta.Epoch, consumed: st.Meta.EpochConsumed}
	}
	t.total = t.plan.total(t.at)
	if env.trace != nil {
		t.layers = newLayerTrace(env.trace, net)
	}
	if env.threads > 1 {
		if err := net.SetThreads(env.threads); err != nil {
			return nil, err
		}
	}
	ck, err := models.ParseCheckpointing(spec.GetActivationCheckpointing())
	if err == nil {
		err = net.SetCheckpointing(ck)
	}
	if err == nil {
		var p models.Precision
		if p, err = models.ParsePrecision(spec.GetPrecision()); err == nil {
			err = net.SetPrecision(p)
		}
	}
	if err != nil {
		net.Close()
		return nil, err
	}
	return t, nil
}

// join connects the Trainer to its job's synchronizer; the caller closes
// t.sync.
func (t *Trainer) join(ctx context.Context) error {
	var s synchronizer
	var err error
	switch {
	case jobspec.Pipelined(t.spec):
		s, err = newPipeTask(ctx, t.a, t.env, t.net, t.obj, t.total)
	case jobspec.LabelSharded(t.spec):
		s, err = newLabelTask(ctx, t.a, t.env, t.net, t.obj, t.total)
	case jobspec.TensorParallel(t.spec):
		s, err = newTensorTask(ctx, t.a, t.env, t.net, t.obj, t.total)
	default:
		s, err = startSync(ctx, t.a, t.env, t.net, t.total, psStart{step: t.at.step, trainExamples: t.plan.trainLen})
	}
	if err != nil {
		return err
	}
	t.sync = s
	return nil
}

// run resumes, trains the remaining epochs and returns the result.
func (t *Trainer) run(ctx context.Context) (*pb.JobResult, error) {
	if err := t.resume(ctx); err != nil {
		return nil, err
	}
	t.res = &pb.JobResult{GemmBackend: kernels.Backend()}
	t.start = time.Now()
	t.lastReport = t.start
	t.times = newStepTimes(t.sync.stats().leftWait)
	for epoch := t.from.epoch; epoch < t.plan.epochs && t.at.step < t.total; epoch++ {
		if err := t.epoch(ctx, epoch); err != nil {
			return nil, err
		}
	}
	return t.finish(ctx)
}

// resume brings the rank to where its generation starts (the
// synchronizer decides from what state) and counts the steps from there.
func (t *Trainer) resume(ctx context.Context) error {
	o, err := t.sync.start(ctx, resumeFrom{ckpt: t.ckpt, at: t.at, plan: t.plan})
	if err != nil {
		return err
	}
	t.from, t.at = o.at, o.at
	t.total = t.plan.total(t.at)
	if o.source == fromCheckpoint {
		// In ps mode the parameter server has loaded the checkpoint and
		// sent its parameters, tagged with its step (joinPS checks it).
		t.env.log.Info("resumed from a checkpoint", "job", t.a.JobId, "path", t.a.ResumeFrom, "step", t.at.step,
			"epoch", t.at.epoch, "consumed", t.at.consumed)
	}
	// Dropout masks come from a per-network counter of training passes: a
	// resumed task (checkpoint or memory snapshot) sets it as a run that
	// never stopped would have it.
	t.net.SetDropoutCalls(uint64(t.at.step) * uint64(max(t.spec.GetGradAccumSteps(), 1)))
	return nil
}

// epoch trains this rank's share of epoch (the rest of it, in the epoch
// training starts in).
func (t *Trainer) epoch(ctx context.Context, epoch int) error {
	rank, world, err := dataShard(t.a) // the data shard: a pipeline job's replica
	if err != nil {
		return err
	}
	start := t.plan.epochStart(epoch, t.from)
	var idx []int
	if start > 0 {
		idx = data.ResumeSampler(t.plan.trainLen, t.spec.GetSeed(), epoch, int(start), rank, world)
	} else {
		idx = t.sampler.EpochInto(t.epochIdx, epoch)
	}
	nb := t.plan.stepsIn(epoch, t.from)
	bs := t.plan.batch
	if st, ok := t.obj.(*streamed); ok {
		// Streamed data: the loader decodes this epoch's order ahead of
		// the steps, in the micro-batches forwardBackward asks for.
		if err := st.startEpoch(ctx, idx, t.micro); err != nil {
			return err
		}
		defer st.endEpoch()
	}
	var epochLoss float64
	var epochN int
	for b := 0; b < nb && t.at.step < t.total; b++ {
		if err := ctx.Err(); err != nil {
			t.stopped(ctx)
			return err
		}
		// After a resume a rank may have nothing left in its last step:
		// it contributes zeros.
		batch := idx[min(b*bs, len(idx)):min((b+1)*bs, len(idx))]
		loss, err := t.step(ctx, epoch, batch)
		if err != nil {
			return err
		}
		t.at = t.plan.after(t.at.step+1, epoch, start, b, nb)
		t.lossSum += float64(loss)
		t.lossN++
		epochLoss += float64(loss)
		epochN++
		t.images += len(batch)
		t.evaluated = false
		t.report(epoch)
		if err := t.sync.completed(ctx, epoch, t.at); err != nil {
			return err
		}
	}
	t.res.Epochs = int32(epoch + 1)
	t.res.TrainLoss = epochLoss / float64(max(epochN, 1))
	if t.spec.GetEvalEveryEpoch() && epochN == nb {
		if err := t.evaluate(ctx); err != nil {
			return err
		}
		t.evaluated = true
	}
	return nil
}

// step computes the gradient of batch (examples of epoch's order) and
// has the synchronizer turn it into the next parameters; it returns the
// batch's mean loss.
func (t *Trainer) step(ctx context.Context, epoch int, batch []int) (float32, error) {
	stepStart := time.Now()
	injectDelay(ctx, t.env.stepDelay)
	net := t.net
	net.ZeroGrad()
	ready, err := t.sync.beginStep(ctx, net.Grads())
	if err != nil {
		return 0, fmt.Errorf("step %d: %w", t.at.step, err)
	}
	scale := t.sync.lossScale()
	loss, err := t.sync.gradient(ctx, t.at.step, epoch, batch, func() (float32, error) {
		return forwardBackward(net, t.obj, batch, t.micro, t.x, t.dl, epoch, scale, ready, t.layers)
	})
	if err != nil {
		return 0, fmt.Errorf("step %d: %w", t.at.step, err)
	}
	syncStart := time.Now()
	t.times.step(syncStart.Sub(stepStart))
	if t.layers != nil {
		defer func() {
			t.env.trace.Span("all-reduce wait + optimiser", trace.CatOptim, trace.TidCompute, syncStart, time.Now(), map[string]any{"step": t.at.step})
		}()
	}
	if err := t.sync.step(ctx, net.Grads(), net.Params()); err != nil {
		// The step failed (cancelled, or the ring broke as the job was
		// ended elsewhere): the parameters are still those after the
		// last step, a consistent state to resume from.
		t.stopped(ctx)
		return 0, fmt.Errorf("step %d: %w", t.at.step, err)
	}
	now := time.Now()
	t.env.metrics.ObserveCollective(t.spec.Mode, now.Sub(syncStart))
	t.env.metrics.ObserveStep(now.Sub(stepStart))
	return loss, nil
}

// stopped has the synchronizer keep the state after the last completed
// step when the task stops early, unless this task trained none.
func (t *Trainer) stopped(ctx context.Context) {
	if t.at.step == t.from.step {
		return
	}
	t.sync.stopped(ctx, t.at)
}

// report sends a progress report every log_every_steps and after the
// last step: the means since the previous report. Reports may be dropped
// when the session's queue is full.
func (t *Trainer) report(epoch int) {
	step, total := t.at.step, t.total
	if step%int64(t.spec.LogEverySteps) != 0 && step != total {
		return
	}
	now := time.Now()
	elapsed := now.Sub(t.start).Seconds()
	p := &pb.Progress{
		Epoch: int32(epoch + 1), Step: step, TotalSteps: total, Loss: t.lossSum / float64(t.lossN),
		ImagesPerSecond: float64(t.images) / now.Sub(t.lastReport).Seconds() / imageShare(t.spec),
		LearningRate:    optim.LearningRate(t.spec, step-1, total), ElapsedSeconds: elapsed,
		EtaSeconds: elapsed / float64(step-t.from.step) * float64(total-step),
	}
	st := t.sync.stats()
	if c := st.compress; c.Steps > 0 && c.SentBytes > 0 {
		p.SentBytesPerStep = float64(c.SentBytes) / float64(c.Steps)
		p.CompressionRatio = float64(c.RawBytes) / float64(c.SentBytes)
	}
	if sd, ok := t.obj.(*streamed); ok {
		now := sd.loaderStats()
		p.LoaderImagesPerSecond = loaderRate(t.lastLoader, now)
		t.lastLoader = now
	}
	t.times.report(p, st.leftWait)
	p.SkippedSteps, p.LossScale = st.skipped, float64(st.lossScale)
	st.staleness.fill(p, nil)
	st.stage.fill(p)
	t.env.metrics.SetImagesPerSecond(t.a.JobId, int(t.a.Rank), p.ImagesPerSecond)
	t.env.rep.trySend(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Progress{Progress: &pb.TaskProgress{
		JobId: t.a.JobId, Generation: t.a.Generation, Rank: t.a.Rank, Progress: p}}})
	t.lossSum, t.lossN, t.images, t.lastReport = 0, 0, 0, now
}

// finish fills the result: the synchronizer's figures, the parameters'
// checksum, throughput, and rank 0's final evaluation unless the last
// epoch's already is.
func (t *Trainer) finish(ctx context.Context) (*pb.JobResult, error) {
	res := t.res
	step := t.at.step
	res.Steps = step
	st := t.sync.stats()
	if c := st.compress; c.Steps > 0 && c.SentBytes > 0 {
		res.RawBytesPerStep = float64(c.RawBytes) / float64(c.Steps)
		res.SentBytesPerStep = float64(c.SentBytes) / float64(c.Steps)
		res.CompressionRatio = float64(c.RawBytes) / float64(c.SentBytes)
		res.CompressSeconds = c.CompressSeconds
	}
	st.staleness.fill(nil, res)
	res.SkippedSteps, res.LossScale = st.skipped, float64(st.lossScale)
	if t.env.trace != nil {
		res.CommOverlapRatio = overlapRatio(t.env.trace)
	}
	res.ParameterChecksum = t.sync.checksum(t.net.Params())
	wall := time.Since(t.start).Seconds()
	res.ImagesPerSecond = float64(step-t.from.step) * float64(t.plan.batch) / wall / imageShare(t.spec)
	if sd, ok := t.obj.(*streamed); ok {
		res.LoaderImagesPerSecond = sd.loaderStats().Capacity()
	}
	if st.snapshots > 0 && step > t.from.step {
		t.env.log.Info("in-memory snapshots", "job", t.a.JobId, "rank", int(t.a.Rank), "taken", st.snapshots,
			"copy_us_per_step", float64(st.snapshotCopying.Microseconds())/float64(st.snapshots),
			"share_of_step_time", st.snapshotCopying.Seconds()/wall)
	}
	if !t.evaluated {
		if err := t.evaluate(ctx); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// evaluate runs the model over the test split into the result and
// reports it (every rank calls it; the synchronizer says which ranks take
// part and which one reports).
func (t *Trainer) evaluate(ctx context.Context) error {
	res := t.res
	reported, err := t.sync.evaluate(ctx, t.a.Rank, t.net, res, func(net forwarder, into *pb.JobResult) error {
		return t.obj.evaluate(ctx, net, into)
	})
	if err != nil {
		if ctx.Err() != nil {
			// Cancelled while evaluating (rank 0, after an epoch's last
			// step or the job's): keep the state after the last step, as
			// a cancel between steps does, so a resume finds it.
			t.stopped(ctx)
		}
		return err
	}
	if !reported {
		return nil
	}
	t.env.rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Eval{Eval: &pb.TaskEval{JobId: t.a.JobId, Rank: t.a.Rank,
		Generation: t.a.Generation, Epoch: res.Epochs, Step: t.at.step, TestAccuracy: res.TestAccuracy, TestLoss: res.TestLoss,
		TrainLoss: res.TrainLoss, MicroF1: res.MicroF1, MacroF1: res.MacroF1, MeanAveragePrecision: res.MeanAveragePrecision}}})
	return nil
}

// injectDelay is the --debug-step-delay fault injection: it makes this
// rank slow by d per step, returning early when ctx ends.
func injectDelay(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
