package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
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
	// pipe is this worker's Pipeline endpoint (pipeline stages' links).
	pipe *peerrpc.Endpoint
	// stepDelay is injected before every step's forward pass
	// (Config.DebugStepDelay: a slow worker, for fault-injection tests).
	stepDelay time.Duration
	// modelMeta goes into the checkpoints' model.safetensors metadata
	// (jobspec.ModelMetadata), set once the task's data is open.
	modelMeta map[string]string
	// dataDir overrides the spec's dataset.data_dir (Config.DataDir).
	dataDir string
	// threads run each step of a Trainer (Config.Threads; 0 or 1: one).
	threads int
	// algo overrides the spec's collective.algorithm (Config.Algorithm).
	algo string
	// trace records the task's timeline (Config.TracePath); nil: none.
	trace *trace.Recorder
	// snaps keeps ring ranks' in-memory snapshots across tasks (nil: the
	// task keeps its own, which die with it).
	snaps *snapshotStore
	// Entrypoint jobs (entry.go): whether this worker runs their
	// commands, where their output goes, and this worker's name for
	// their errors.
	allowEntrypoints bool
	runsDir          string
	worker           string
}

// runAssignment runs one assignment: it loads the data set, then hands a
// fedavg job to the federated simulation or client and a ps or ring job
// to a Trainer.
func runAssignment(ctx context.Context, a *pb.Assignment, env *taskEnv) (*pb.JobResult, error) {
	log := env.log
	spec := a.Spec
	if spec == nil {
		return nil, errors.New("assignment without a spec")
	}
	if spec.GetEntrypoint() != nil {
		if jobspec.RealClients(spec) {
			return runFedEntrypoint(ctx, a, env)
		}
		return runEntrypoint(ctx, a, env)
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
	var train, test *data.Dataset
	var err error
	switch {
	case jobspec.Streamed(ds) && spec.GetMode() != "fedavg":
		return runStreamed(ctx, a, env, dir)
	case jobspec.Streamed(ds):
		train, test, err = materializeStreamed(ctx, spec, dir, log)
	default:
		train, test, err = data.Load(ctx, data.LoadOptions{Name: name, Dir: dir,
			SyntheticTrain: int(ds.GetSyntheticTrain()), SyntheticTest: int(ds.GetSyntheticTest()), Seed: seed})
	}
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
	return runTrainer(ctx, a, env, obj)
}

// runStreamed runs a ps or ring task on a streamed data set (imagefolder,
// cifar10, cifar100), opened from dir (or dataset.data_dir).
func runStreamed(ctx context.Context, a *pb.Assignment, env *taskEnv, dir string) (*pb.JobResult, error) {
	s, err := openStreamed(ctx, a.Spec, dir, env.log)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return runTrainer(ctx, a, env, s)
}

// runTrainer runs a ps or ring task's Trainer over obj.
func runTrainer(ctx context.Context, a *pb.Assignment, env *taskEnv, obj objective) (*pb.JobResult, error) {
	mean, std := normalization(obj)
	env.modelMeta = jobspec.ModelMetadata(a.Spec, mean, std)
	t, err := newTrainer(a, env, obj)
	if err != nil {
		return nil, err
	}
	defer t.net.Close() // stops SetThreads' goroutines
	if err := t.join(ctx); err != nil {
		return nil, err
	}
	defer t.sync.close()
	return t.run(ctx)
}
