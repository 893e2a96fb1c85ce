package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// taskEnv is what a task uses of its worker.
type taskEnv struct {
	conn    *grpc.ClientConn // to the coordinator (and parameter server)
	rep     *reporter
	log     *slog.Logger
	metrics *metrics.Registry // may be nil
	// psDial are the options for connections to `gradsync aggregator`
	// processes (those of the coordinator's connection).
	psDial []grpc.DialOption
	// ring is this worker's peer endpoint; peerDial secures its links.
	ring     *ringrpc.Endpoint
	peerDial []grpc.DialOption
	// stepDelay is injected before every step's forward pass
	// (Config.DebugStepDelay: a slow worker, for fault-injection tests).
	stepDelay time.Duration
	// dataDir overrides the spec's dataset.data_dir (Config.DataDir).
	dataDir string
	// snaps keeps ring ranks' in-memory snapshots across tasks (nil: the
	// task keeps its own, which die with it).
	snaps *snapshotStore
}

// runTask trains rank a.Rank of a ps or ring job (or hands a fedavg job to
// its federated runner): each step it computes the gradient of its batch
// and the synchroniser turns it into the job's next parameters. Rank 0
// evaluates on the test split after every epoch and at the end.
func runTask(ctx context.Context, a *pb.Assignment, env *taskEnv) (*pb.JobResult, error) {
	log, rep := env.log, env.rep
	spec := a.Spec
	if spec == nil {
		return nil, errors.New("assignment without a spec")
	}
	seed := spec.GetSeed()
	ds := spec.GetDataset()
	loadStart := time.Now()
	name := ds.GetName()
	if name == jobspec.MultiLabelMNIST {
		name = data.MNIST
	}
	dir := ds.GetDataDir()
	if env.dataDir != "" {
		dir = env.dataDir
	}
	train, test, err := data.Load(ctx, data.LoadOptions{Name: name, Dir: dir,
		SyntheticTrain: int(ds.GetSyntheticTrain()), SyntheticTest: int(ds.GetSyntheticTest()), Seed: seed})
	if err != nil {
		return nil, err
	}
	log.Debug("data loaded", "dataset", train.Name, "train", train.Len(), "test", test.Len(), "seconds", time.Since(loadStart).Seconds())
	if spec.GetMode() == "fedavg" {
		if jobspec.RealClients(spec) {
			return runFedClient(ctx, a, env, train, test)
		}
		return runFederated(ctx, a, env, train, test)
	}
	var obj objective = newClassification(train, test, spec)
	if ds.GetName() == jobspec.MultiLabelMNIST {
		mtrain, err := data.MultiDigit(train, train.Len(), seed)
		if err != nil {
			return nil, err
		}
		mtest, err := data.MultiDigit(test, test.Len(), seed+1)
		if err != nil {
			return nil, err
		}
		obj = newMultiLabel(mtrain, mtest)
	}
	opt := obj.shape()
	opt.Seed = seed
	net, err := models.New(spec.Model, opt)
	if err != nil {
		return nil, err
	}
	if int64(net.NumParams()) != a.NumParams {
		return nil, fmt.Errorf("model %s has %d parameters here but %d on the coordinator", spec.Model, net.NumParams(), a.NumParams)
	}
	rank, world := int(a.Rank), int(a.WorldSize)
	sampler, err := data.NewSampler(obj.trainLen(), rank, world, seed, true, false)
	if err != nil {
		return nil, err
	}
	bs := jobspec.StepBatch(spec)     // examples per optimiser step on this rank
	micro := int(spec.GetBatchSize()) // examples per forward/backward pass (bs/grad_accum_steps)
	stepsPerEpoch := sampler.NumBatches(bs)
	epochs := int(spec.GetEpochs())
	nTrain := obj.trainLen()

	// Where training starts: from scratch, or where a checkpoint stopped
	// (possibly with another world size: the rest of that epoch is dealt
	// out again so that no sample is lost or repeated).
	var step int64
	startEpoch, consumed := 0, int64(0)
	var resumeMeta *checkpoint.Meta
	var resumeState *checkpoint.State
	if a.ResumeFrom != "" {
		st, err := checkpoint.Load(a.ResumeFrom)
		if err != nil {
			return nil, err
		}
		resumeMeta, resumeState = &st.Meta, st
		step, startEpoch, consumed = st.Meta.Step, st.Meta.Epoch, st.Meta.EpochConsumed
	}
	stepsIn := func(epoch int) int {
		if epoch == startEpoch && consumed > 0 {
			return data.ResumeSteps(nTrain, int(consumed), world, bs)
		}
		return stepsPerEpoch
	}
	countSteps := func() int64 {
		total := step
		for e := startEpoch; e < epochs; e++ {
			total += int64(stepsIn(e))
		}
		if spec.MaxSteps > 0 && spec.MaxSteps < total {
			total = spec.MaxSteps
		}
		return total
	}
	totalSteps := countSteps()

	sync, err := startSync(ctx, a, env, net, totalSteps, psStart{step: step, trainExamples: nTrain})
	if err != nil {
		return nil, err
	}
	defer sync.close()
	if pc, ok := sync.(*psClient); ok && resumeState != nil {
		// The server restored the parameters (one shard: jobspec); the
		// compression state of this rank (error feedback, warm-start Q)
		// is the rank's.
		if err := restoreCompression(resumeState, rank, world, pc.links[0].push, log, a.JobId); err != nil {
			return nil, err
		}
	}
	var ckpt *checkpointer
	rs, isRing := sync.(*ringSync)
	var snaps *jobSnapshots // ring mode: this rank's in-memory snapshots
	if isRing {
		// Every generation of a ring job starts by agreeing on its state:
		// the newest in-memory snapshot the ranks share, else the
		// checkpoint, else scratch (see ringSync.agree).
		if env.snaps != nil {
			snaps = env.snaps.forJob(a.JobId)
		} else {
			snaps = &jobSnapshots{}
		}
		ckptStep := int64(-1)
		if resumeMeta != nil {
			ckptStep = resumeMeta.Step
		}
		sp, err := rs.agree(ctx, snaps, a.Generation, ckptStep, a.TrainedSteps, net)
		if err != nil {
			return nil, err
		}
		switch sp.source {
		case fromMemory:
			step, startEpoch, consumed = sp.step, sp.epoch, sp.consumed
			resumeMeta = nil // the snapshot is newer than the checkpoint
			totalSteps = countSteps()
			rs.total = totalSteps
			log.Info("resumed from an in-memory snapshot", "job", a.JobId, "generation", a.Generation, "source_rank", sp.srcRank,
				"step", step, "newest_step", sp.newest, "epoch", startEpoch, "consumed", consumed, "seconds", sp.took.Seconds())
		case fromCheckpoint:
			if err := restoreCompression(resumeState, rank, world, rs.state, log, a.JobId); err != nil {
				return nil, err
			}
		}
		if rank == 0 {
			st := &pb.TaskStarted{JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, Step: step, Source: sp.source,
				SourceRank: int32(sp.srcRank), NewestStep: sp.newest, AgreeSeconds: sp.took.Seconds()}
			if sp.source == fromCheckpoint {
				st.Checkpoint = a.ResumeFrom
			}
			rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Started{Started: st}})
		}
	}
	if resumeMeta != nil {
		// In ps mode the parameter server has loaded the checkpoint and
		// sent its parameters, tagged with its step (joinPS checks it).
		if isRing {
			if _, err := resume(a.ResumeFrom, spec, net, rs.optim); err != nil {
				return nil, err
			}
			rs.steps = step
		}
		log.Info("resumed from a checkpoint", "job", a.JobId, "path", a.ResumeFrom, "step", step, "epoch", startEpoch, "consumed", consumed)
	}
	if snaps != nil {
		// The state this generation starts from is its first snapshot;
		// snapshots of earlier generations are gone.
		snaps.reset()
		snaps.take(a.Generation, step, startEpoch, consumed, net, rs.optim, rs.state)
	}
	// With per-rank compression state (error feedback) every rank takes
	// part in a checkpoint: rank 0 gathers their residuals.
	gather := isRing && a.CheckpointDir != "" && rs.gathersCompression()
	if isRing && a.CheckpointDir != "" && (rank == 0 || gather) {
		ckpt = &checkpointer{dir: a.CheckpointDir, spec: spec, jobID: a.JobId, world: world, lastSave: time.Now()}
	}
	// saveCheckpoint writes a checkpoint (rank 0); with gatherNow every
	// rank calls it at the same step.
	saveCheckpoint := func(epoch int, consumed int64, gatherNow bool) error {
		extra, err := rs.compressionExtra(ctx, gatherNow)
		if err != nil {
			return err
		}
		if rank != 0 {
			return nil
		}
		path, err := ckpt.save(net, rs.optim, step, epoch, consumed, extra, time.Now())
		if err != nil {
			return fmt.Errorf("writing a checkpoint: %w", err)
		}
		log.Debug("checkpoint written", "job", a.JobId, "path", path)
		return nil
	}
	// checkpointDue is rank 0's decision, on every rank that takes part.
	checkpointDue := func(epochEnd bool, epoch int) (bool, error) {
		due := ckpt.due(step, epochEnd, epoch, time.Now())
		if !gather {
			return due, nil
		}
		return rs.decideCheckpoint(ctx, due, spec.GetCheckpoint().GetEverySeconds() > 0)
	}

	inSize, classes := net.InputSize(), opt.Classes
	x := make([]float32, micro*inSize)
	dl := make([]float32, micro*classes)
	epochIdx := make([]int, sampler.Len())
	var idx []int
	res := &pb.JobResult{GemmBackend: kernels.Backend()}
	evalAndReport := func(step int64) error {
		if err := obj.evaluate(ctx, net, res); err != nil {
			return err
		}
		rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Eval{Eval: &pb.TaskEval{JobId: a.JobId, Rank: a.Rank, Generation: a.Generation,
			Epoch: res.Epochs, Step: step, TestAccuracy: res.TestAccuracy, TestLoss: res.TestLoss, TrainLoss: res.TrainLoss,
			MicroF1: res.MicroF1, MacroF1: res.MacroF1, MeanAveragePrecision: res.MeanAveragePrecision}}})
		return nil
	}
	start := time.Now()
	firstStep := step
	// Dropout masks come from a per-network counter of training passes: a
	// resumed task (checkpoint or memory snapshot) sets it as a run that
	// never stopped would have it.
	net.SetDropoutCalls(uint64(step) * uint64(max(spec.GetGradAccumSteps(), 1)))
	// saveOnCancel writes rank 0's state when the task stops early (a user
	// cancel, or the job ending elsewhere), so that --resume loses nothing:
	// epochStart + b·bs·world positions of the epoch's order are done.
	saveOnCancel := func(epoch int, epochStart int64, b int) {
		if ckpt == nil || rank != 0 || step == firstStep {
			return
		}
		done := min(epochStart+int64(b*bs*world), int64(nTrain))
		if err := saveCheckpoint(epoch, done, false); err != nil {
			log.Warn("checkpoint at cancellation failed", "job", a.JobId, "err", err)
		}
	}
	var lossSum float64
	var lossN, imagesSince int
	lastReport := start
	times := newStepTimes(sync)
	evaluated := false
	logEvery := int64(spec.LogEverySteps)
	for epoch := startEpoch; epoch < epochs && step < totalSteps; epoch++ {
		epochStart := int64(0) // positions of this epoch's order consumed before it (re)started
		if epoch == startEpoch && consumed > 0 {
			idx = data.ResumeSampler(nTrain, seed, epoch, int(consumed), rank, world)
			epochStart = consumed
		} else {
			idx = sampler.EpochInto(epochIdx, epoch)
		}
		nb := stepsIn(epoch)
		var epochLoss float64
		var epochN int
		for b := 0; b < nb && step < totalSteps; b++ {
			if err := ctx.Err(); err != nil {
				saveOnCancel(epoch, epochStart, b)
				return nil, err
			}
			stepStart := time.Now()
			injectDelay(ctx, env.stepDelay)
			batch := idx[min(b*bs, len(idx)):min((b+1)*bs, len(idx))]
			n := len(batch)
			net.ZeroGrad()
			var ready func(from int)
			if ov, ok := sync.(overlapper); ok {
				if ready, err = ov.beginStep(ctx, net.Grads()); err != nil {
					return nil, fmt.Errorf("step %d: %w", step, err)
				}
			}
			// After a resume a rank may have nothing left in its last step:
			// it contributes zeros.
			loss := forwardBackward(net, obj, batch, micro, x, dl, epoch, ready)
			syncStart := time.Now()
			times.step(syncStart.Sub(stepStart))
			if err := sync.step(ctx, net.Grads(), net.Params()); err != nil {
				// The step failed (cancelled, or the ring broke as the job
				// was ended elsewhere): the parameters are still those after
				// the last step, a consistent state to resume from.
				saveOnCancel(epoch, epochStart, b)
				return nil, withRingLinks(sync, fmt.Errorf("step %d: %w", step, err))
			}
			now := time.Now()
			env.metrics.ObserveCollective(spec.Mode, now.Sub(syncStart))
			env.metrics.ObserveStep(now.Sub(stepStart))
			step++
			if snaps != nil {
				se, sc := epoch, min(epochStart+int64((b+1)*bs*world), int64(nTrain))
				if b+1 == nb {
					se, sc = epoch+1, 0
				}
				snaps.take(a.Generation, step, se, sc, net, rs.optim, rs.state)
			}
			lossSum += float64(loss)
			lossN++
			epochLoss += float64(loss)
			epochN++
			imagesSince += n
			evaluated = false
			if step%logEvery == 0 || step == totalSteps {
				now := time.Now()
				elapsed := now.Sub(start).Seconds()
				p := &pb.Progress{
					Epoch: int32(epoch + 1), Step: step, TotalSteps: totalSteps, Loss: lossSum / float64(lossN),
					ImagesPerSecond: float64(imagesSince) / now.Sub(lastReport).Seconds(),
					LearningRate:    jobspec.LearningRate(spec, step-1, totalSteps), ElapsedSeconds: elapsed,
					EtaSeconds: elapsed / float64(step-firstStep) * float64(totalSteps-step),
				}
				if cs, ok := sync.(compressStatser); ok {
					if st := cs.compressStats(); st.Steps > 0 && st.SentBytes > 0 {
						p.SentBytesPerStep = float64(st.SentBytes) / float64(st.Steps)
						p.CompressionRatio = float64(st.RawBytes) / float64(st.SentBytes)
					}
				}
				times.report(p)
				if ps, ok := sync.(psStatser); ok {
					ps.psStaleness().fill(p, nil)
				}
				env.metrics.SetImagesPerSecond(a.JobId, rank, p.ImagesPerSecond)
				rep.trySend(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Progress{Progress: &pb.TaskProgress{
					JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, Progress: p}}})
				lossSum, lossN, imagesSince, lastReport = 0, 0, 0, now
			}
			if ckpt != nil && b+1 < nb {
				due, err := checkpointDue(false, epoch)
				if err != nil {
					return nil, err
				}
				if due {
					done := min(epochStart+int64((b+1)*bs*world), int64(nTrain))
					if err := saveCheckpoint(epoch, done, gather); err != nil {
						return nil, err
					}
				}
			}
		}
		if ckpt != nil && epochN == nb {
			due, err := checkpointDue(true, epoch)
			if err != nil {
				return nil, err
			}
			if due {
				if err := saveCheckpoint(epoch+1, 0, gather); err != nil {
					return nil, err
				}
			}
		}
		res.Epochs = int32(epoch + 1)
		res.TrainLoss = epochLoss / float64(max(epochN, 1))
		if rank == 0 && spec.GetEvalEveryEpoch() && epochN == nb {
			if err := evalAndReport(step); err != nil {
				return nil, err
			}
			evaluated = true
		}
	}
	res.Steps = step
	if cs, ok := sync.(compressStatser); ok {
		if st := cs.compressStats(); st.Steps > 0 && st.SentBytes > 0 {
			res.RawBytesPerStep = float64(st.RawBytes) / float64(st.Steps)
			res.SentBytesPerStep = float64(st.SentBytes) / float64(st.Steps)
			res.CompressionRatio = float64(st.RawBytes) / float64(st.SentBytes)
			res.CompressSeconds = st.CompressSeconds
		}
	}
	if ps, ok := sync.(psStatser); ok {
		ps.psStaleness().fill(nil, res)
	}
	res.ParameterChecksum = models.Checksum(net.Params())
	wall := time.Since(start).Seconds()
	res.ImagesPerSecond = float64(step-firstStep) * float64(bs) / wall
	if snaps != nil && step > firstStep {
		log.Info("in-memory snapshots", "job", a.JobId, "rank", rank, "taken", snaps.taken,
			"copy_us_per_step", float64(snaps.copying.Microseconds())/float64(snaps.taken),
			"share_of_step_time", snaps.copying.Seconds()/wall)
	}
	if rank == 0 && !evaluated {
		if err := evalAndReport(step); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// synchronizer turns this rank's gradient of each step into the job's next
// parameters: through the parameter server (ps mode) or by all-reducing
// with the other ranks and stepping a local optimiser (ring mode).
type synchronizer interface {
	// step reduces grads (this rank's gradient of the current step) and
	// leaves the next parameters in params.
	step(ctx context.Context, grads, params []float32) error
	close()
}

// overlapper is a synchronizer that can start reducing while backward
// runs (ring mode without compression): beginStep before backward, whose
// progress goes to the returned function (nil: reduce in step).
type overlapper interface {
	beginStep(ctx context.Context, grads []float32) (func(from int), error)
}

// compressStatser is a synchronizer that compresses (ring mode).
type compressStatser interface{ compressStats() compress.Stats }

// psStart is what a ps rank tells the parameter server as it joins: the
// step it starts at (a resumed checkpoint's, else 0) and the size of the
// training split (from which the server, which writes ps checkpoints,
// knows the sampler position after each step).
type psStart struct {
	step          int64
	trainExamples int
}

// startSync joins the job's synchroniser and brings the model's parameters
// to the job's initial ones.
func startSync(ctx context.Context, a *pb.Assignment, env *taskEnv, net *models.Network, totalSteps int64, ps psStart) (synchronizer, error) {
	switch mode := a.Spec.GetMode(); mode {
	case "ps":
		return joinPS(ctx, env, a, net, totalSteps, ps)
	case "ring":
		r, err := env.ring.Join(ctx, ringrpc.RingConfig{JobID: a.JobId, Generation: a.Generation, Rank: int(a.Rank),
			Peers: a.Peers, DialOptions: env.peerDial})
		if err != nil {
			return nil, err
		}
		// Leave the ring gracefully: the neighbours may still need the
		// last frames; Shutdown waits for them (bounded), then closes.
		leave := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Shutdown(ctx); err != nil {
				env.log.Debug("leaving the ring", "job", a.JobId, "err", err)
			}
		}
		rs, err := newRingSync(ctx, r, leave, a, net, totalSteps, env.metrics)
		if err != nil {
			r.Close()
			return nil, err
		}
		return rs, nil
	default:
		return nil, fmt.Errorf("mode %q is not supported by this worker", mode)
	}
}
