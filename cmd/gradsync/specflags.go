package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// specFlags are the job-spec flags shared by local and submit. A flag given
// on the command line overrides the same field of the job file.
type specFlags struct {
	file      string
	name      string
	model     string
	dataset   string
	dataDir   string
	imageSize string
	channels  int32
	granular  string
	augment   string
	cacheMB   int32
	mean, std []float64
	mode      string
	workers   int32
	batchSize int32
	epochs    int32
	maxSteps  int64
	lr        float64
	momentum  float64
	seed      int64
	logEvery  int32
	timeout   float64
	gradAccum int32
	gradClip  float64
	// pipeline parallelism
	stages       int32
	microBatches int32
	schedule     string
	dataPar      int32
	boundaries   []string
	balance      string
	stageCost    string
	// model parallelism (tensorpar)
	labelShards int32
	tensor      int32
	// fedavg
	rounds      int32
	clients     int32
	fraction    float64
	localEpochs int32
	localBatch  int32
	strategy    string
	mu          float64
	partition   string
	alpha       float64
	compress    string
	reweighting string
	weighting   string
	serverLR    float64
	serverMom   float64
	// ps mode
	psShards      int32
	psConsistency string
	psStaleness   int32
	psAddrs       []string
	jitter        []float64 // --color-jitter: brightness, contrast, saturation[, hue]
	// entrypoint jobs
	entrypoint string
	// engine
	precision string
	transport string
	actCkpt   string
}

func (f *specFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "job spec file (YAML or JSON); flags override its fields")
	fl.StringVar(&f.name, "name", "", "job name (default model-dataset)")
	fl.StringVar(&f.model, "model", "", "architecture: "+fmt.Sprint(jobspec.Architectures)+" (default mlp)")
	fl.StringVar(&f.dataset, "dataset", "", "dataset: "+strings.Join(jobspec.DatasetNames(), ", ")+" (default mnist)")
	fl.StringVar(&f.dataDir, "data-dir", "", "folder holding the four IDX files, the ImageFolder or the CIFAR binary files (default for the IDX sets: built-in locations)")
	fl.StringVar(&f.imageSize, "image-size", "", "imagefolder: resize and centre-crop every image to HxW, e.g. 32x32 (default: keep sizes, which must then agree)")
	fl.Int32Var(&f.channels, "channels", 0, "imagefolder: 1 (grayscale) or 3 (RGB; default)")
	fl.StringVar(&f.granular, "label-granularity", "", "cifar100: fine (100 classes; default) or coarse (20 superclasses)")
	fl.StringVar(&f.augment, "augment", "", "training augmentation: none (default), crop (random crop with zero padding: 2 for the 28×28 sets, 4 for imagefolder and cifar) or crop-flip (also a horizontal flip)")
	fl.Float64SliceVar(&f.jitter, "color-jitter", nil, "imagefolder, cifar: colour jitter of training images, brightness,contrast,saturation[,hue] as torchvision's ColorJitter, e.g. 0.4,0.4,0.4 or 0.4,0.4,0.4,0.1 (hue at most 0.5; default: off)")
	fl.Int32Var(&f.cacheMB, "cache-mb", 0, "imagefolder, cifar: MiB of decoded images a worker keeps in memory; larger sets stream from disk every epoch (default 1024; 0: none)")
	fl.Float64SliceVar(&f.mean, "mean", nil, "imagefolder, cifar: per-channel mean on the [0, 1] scale, e.g. 0.49,0.48,0.45 (default: computed over the training split and cached beside the data)")
	fl.Float64SliceVar(&f.std, "std", nil, "imagefolder, cifar: per-channel standard deviation (with --mean)")
	fl.StringVar(&f.mode, "mode", "", "how workers agree on updates: ps, ring or fedavg (default ps)")
	fl.Int32Var(&f.workers, "workers", 0, "number of workers (default 1)")
	fl.Int32Var(&f.batchSize, "batch-size", 0, "examples per worker per step (default 32)")
	fl.Int32Var(&f.epochs, "epochs", 0, "passes over the training set (default 1)")
	fl.Int64Var(&f.maxSteps, "max-steps", 0, "stop after this many steps (default: no limit)")
	fl.Float64Var(&f.lr, "lr", 0, "learning rate (default 0.05; in fedavg mode the clients')")
	fl.Float64Var(&f.momentum, "momentum", 0, "SGD momentum (default 0.9)")
	fl.Int64Var(&f.seed, "seed", 0, "random seed (default 1)")
	fl.Int32Var(&f.logEvery, "log-every", 0, "report progress every N steps (default 20)")
	fl.Float64Var(&f.timeout, "step-timeout", 0, "seconds a step may take before the job fails (default 60)")
	fl.Int32Var(&f.gradAccum, "grad-accum", 0, "accumulate gradients over this many micro-batches of --batch-size per step (default 1)")
	fl.Int32Var(&f.stages, "pipeline-stages", 0, "split the model by layers into this many pipeline stages, one per worker of a replica (default 1: no pipeline)")
	fl.Int32Var(&f.microBatches, "micro-batches", 0, "pipeline: micro-batches per step; --batch-size must be a multiple (default: the stages)")
	fl.StringVar(&f.schedule, "schedule", "", "pipeline schedule: 1f1b (default) or gpipe")
	fl.StringVar(&f.schedule, "pipeline-schedule", "", "the same as --schedule")
	fl.Int32Var(&f.dataPar, "data-parallel", 0, "pipeline: data-parallel replicas D of the pipeline (default: workers / stages)")
	fl.StringSliceVar(&f.boundaries, "pipeline-boundaries", nil, "pipeline: the blocks where stages 1..S-1 start, comma-separated (default: cut by --pipeline-balance)")
	fl.StringVar(&f.balance, "pipeline-balance", "", "pipeline: without --pipeline-boundaries, cut so that the largest stage holds the fewest parameters (params, default) or the slowest stage takes the least time (time: each block timed on a micro-batch when the job is submitted; the cut is written into the job's boundaries)")
	fl.StringVar(&f.stageCost, "debug-stage-cost", "", "pipeline, for measuring schedules: every micro-batch's forward and backward on every stage take at least this long, e.g. fwd=20ms,bwd=40ms")
	fl.Int32Var(&f.labelShards, "label-shards", 0, "split the classifier head's classes over this many workers of each data replica, which hold the rest of the model whole (default 1: none; workers = data × label shards)")
	fl.Int32Var(&f.tensor, "tensor-parallel", 0, "split the model's Megatron layer pairs (mlp: fc1 and fc2; vit-tiny: each transformer block's attention by heads and its MLP) over this many workers of each data replica (default 1: none; workers = data × tensor)")
	fl.Float64Var(&f.gradClip, "grad-clip", 0, "clip the averaged gradient to this global L2 norm (default: off)")
	fl.Int32Var(&f.rounds, "rounds", 0, "fedavg: rounds (default 10)")
	fl.Int32Var(&f.clients, "clients", 0, "fedavg: number of clients (default 10)")
	fl.Float64Var(&f.fraction, "fraction", 0, "fedavg: fraction C of clients sampled per round (default 0.1)")
	fl.Int32Var(&f.localEpochs, "local-epochs", 0, "fedavg: local epochs E (default 1)")
	fl.Int32Var(&f.localBatch, "local-batch", 0, "fedavg: local batch size B (default 10)")
	fl.StringVar(&f.strategy, "strategy", "", "fedavg: fedavg, fedprox, fedavgm, fedadam, fedyogi, median, trimmed-mean")
	fl.Float64Var(&f.mu, "mu", 0, "fedavg: FedProx proximal term (default 0.01 with --strategy fedprox)")
	fl.StringVar(&f.partition, "partition", "", "fedavg: iid, dirichlet, shards or label")
	fl.Float64Var(&f.alpha, "alpha", 0, "fedavg: Dirichlet concentration (default 0.5)")
	fl.StringVar(&f.reweighting, "reweighting", "", "fedavg: client loss reweighting: none or class-balanced")
	fl.StringVar(&f.weighting, "weighting", "", "fedavg: aggregation weights: examples, uniform or label-balanced")
	fl.Float64Var(&f.serverLR, "server-lr", 0, "fedavg: server learning rate (default: the strategy's)")
	fl.Float64Var(&f.serverMom, "server-momentum", 0, "fedavg: FedAvgM server momentum (default 0.9)")
	fl.Int32Var(&f.psShards, "ps-shards", 0, "ps mode: parameter-server shards, each owning a range of the parameters (default 1)")
	fl.StringVar(&f.psConsistency, "ps-consistency", "", "ps mode: sync (default), async (no barrier) or bounded (with --ps-staleness)")
	fl.Int32Var(&f.psStaleness, "ps-staleness", 0, "ps mode, bounded: steps a worker may be ahead of the slowest")
	fl.StringSliceVar(&f.psAddrs, "ps-aggregators", nil, "ps mode: host:port of one 'gradsync aggregator' per shard, in shard order (default: shards in the server)")
	fl.StringVar(&f.entrypoint, "entrypoint", "", "run this command on every worker instead of gradsync's engine (mode ring: a data-parallel script; fedavg: each worker's script is one federated client, gradsync.fl): words split as a shell would, no shell run, e.g. 'python3 train.py --epochs 2'")
	fl.StringVar(&f.compress, "compress", "", "gradient compression (modes ring and ps), e.g. powersgd:rank=2,start_iter=10 | topk:ratio=0.01 | int8 | fp16 | bf16")
	fl.StringVar(&f.transport, "transport", "", "ring collectives' data plane: grpc (the default; auto for an entrypoint's script), shm (ranks on one host move to shared memory, negotiated when the ring forms; falls back to gRPC, saying why) or auto (the same: shared memory where every rank is on one host and the negotiation succeeds, gRPC otherwise; the worker logs which and why)")
	fl.StringVar(&f.precision, "precision", "", "matrix products' operands: fp32 (default), bf16 (modes ps, ring and fedavg) or fp16 (modes ring and fedavg, with a dynamic loss scaler; in fedavg one per client's local run); float32 accumulation and master weights")
	fl.StringVar(&f.actCkpt, "activation-checkpointing", "", "keep only segment inputs and recompute the rest in backward: none (default), blocks (at the model's block boundaries) or sqrt (√n segments); gradients are bit-identical")
}

// build reads the job file (if any) and applies the flags that were set.
func (f *specFlags) build(c *cobra.Command) (*pb.JobSpec, error) {
	spec := &pb.JobSpec{}
	if f.file != "" {
		b, err := os.ReadFile(f.file)
		if err != nil {
			return nil, err
		}
		if spec, err = jobspec.Parse(b); err != nil {
			return nil, fmt.Errorf("%s: %w", f.file, err)
		}
	}
	ch := c.Flags().Changed
	ds := func() *pb.DatasetSpec {
		if spec.Dataset == nil {
			spec.Dataset = &pb.DatasetSpec{}
		}
		return spec.Dataset
	}
	opt := func() *pb.OptimizerSpec {
		if spec.Optimizer == nil {
			spec.Optimizer = &pb.OptimizerSpec{}
		}
		return spec.Optimizer
	}
	if ch("name") {
		spec.Name = f.name
	}
	if ch("model") {
		spec.Model = f.model
	}
	if ch("dataset") {
		ds().Name = f.dataset
	}
	if ch("data-dir") {
		ds().DataDir = f.dataDir
	}
	if ch("image-size") {
		h, w, err := parseImageSize(f.imageSize)
		if err != nil {
			return nil, err
		}
		ds().ImageSize = []int32{h, w}
	}
	if ch("channels") {
		ds().Channels = f.channels
	}
	if ch("label-granularity") {
		ds().LabelGranularity = f.granular
	}
	if ch("augment") {
		ds().Augment = f.augment
	}
	if ch("color-jitter") {
		if len(f.jitter) != 3 && len(f.jitter) != 4 {
			return nil, fmt.Errorf("--color-jitter %v: want three or four values, brightness,contrast,saturation[,hue] (0 leaves one off)", f.jitter)
		}
		ds().JitterBrightness, ds().JitterContrast, ds().JitterSaturation = f.jitter[0], f.jitter[1], f.jitter[2]
		if len(f.jitter) == 4 {
			ds().JitterHue = f.jitter[3]
		}
	}
	if ch("cache-mb") {
		ds().CacheMb = proto.Int32(f.cacheMB)
	}
	if ch("mean") {
		ds().Mean = f.mean
	}
	if ch("std") {
		ds().Std = f.std
	}
	if ch("mode") {
		spec.Mode = f.mode
	}
	if ch("workers") {
		spec.Workers = proto.Int32(f.workers)
	}
	if ch("batch-size") {
		spec.BatchSize = proto.Int32(f.batchSize)
	}
	if ch("epochs") {
		spec.Epochs = proto.Int32(f.epochs)
	}
	if ch("max-steps") {
		spec.MaxSteps = f.maxSteps
	}
	if ch("lr") {
		opt().Lr = proto.Float64(f.lr)
	}
	if ch("momentum") {
		opt().Momentum = proto.Float64(f.momentum)
	}
	if ch("seed") {
		spec.Seed = proto.Int64(f.seed)
	}
	if ch("log-every") {
		spec.LogEverySteps = f.logEvery
	}
	if ch("step-timeout") {
		spec.StepTimeoutSeconds = f.timeout
	}
	if ch("grad-accum") {
		spec.GradAccumSteps = f.gradAccum
	}
	if ch("grad-clip") {
		spec.GradClipNorm = f.gradClip
	}
	applyPipelineFlags(spec, f, ch)
	applyTensorFlags(spec, f, ch)
	fed := func() *pb.FederatedSpec {
		if spec.Federated == nil {
			spec.Federated = &pb.FederatedSpec{}
		}
		return spec.Federated
	}
	part := func() *pb.PartitionSpec {
		if spec.Partition == nil {
			spec.Partition = &pb.PartitionSpec{}
		}
		return spec.Partition
	}
	if ch("rounds") {
		fed().Rounds = f.rounds
	}
	if ch("clients") {
		fed().Clients = f.clients
	}
	if ch("fraction") {
		fed().Fraction = f.fraction
	}
	if ch("local-epochs") {
		fed().LocalEpochs = f.localEpochs
	}
	if ch("local-batch") {
		fed().LocalBatchSize = f.localBatch
	}
	if ch("strategy") {
		fed().Strategy = f.strategy
	}
	if ch("mu") {
		fed().Mu = f.mu
	}
	if ch("partition") {
		part().Type = f.partition
	}
	if ch("reweighting") {
		fed().Reweighting = f.reweighting
	}
	if ch("weighting") {
		fed().Weighting = f.weighting
	}
	if ch("server-lr") {
		fed().ServerLr = f.serverLR
	}
	if ch("server-momentum") {
		fed().ServerMomentum = f.serverMom
	}
	if ch("alpha") {
		part().Alpha = f.alpha
	}
	ps := func() *pb.ParameterServerSpec {
		if spec.ParameterServer == nil {
			spec.ParameterServer = &pb.ParameterServerSpec{}
		}
		return spec.ParameterServer
	}
	if ch("ps-shards") {
		ps().Shards = f.psShards
	}
	if ch("ps-consistency") {
		ps().Consistency = f.psConsistency
	}
	if ch("ps-staleness") {
		ps().Staleness = f.psStaleness
	}
	if ch("ps-aggregators") {
		ps().Addresses = f.psAddrs
		if !ch("ps-shards") && spec.ParameterServer.Shards == 0 {
			ps().Shards = int32(len(f.psAddrs))
		}
	}
	if ch("entrypoint") {
		words, err := splitWords(f.entrypoint)
		if err != nil {
			return nil, fmt.Errorf("--entrypoint: %w", err)
		}
		if spec.Entrypoint == nil {
			spec.Entrypoint = &pb.EntrypointSpec{}
		}
		spec.Entrypoint.Command = words
	}
	if ch("compress") {
		c, err := parseCompress(f.compress)
		if err != nil {
			return nil, err
		}
		spec.Compression = c
	}
	if ch("precision") {
		spec.Precision = f.precision
	}
	if ch("transport") {
		spec.Collective = &pb.CollectiveSpec{Transport: f.transport}
	}
	if ch("activation-checkpointing") {
		spec.ActivationCheckpointing = f.actCkpt
	}
	// A streamed data set's shape is read here, from the data, so the
	// coordinator holds none (jobspec.ResolveShape).
	parent := c.Context()
	if parent == nil { // a command not run through Execute (tests)
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, resolveShapeTimeout)
	defer cancel()
	if err := jobspec.ResolveShape(ctx, spec, ""); err != nil {
		return nil, fmt.Errorf("reading the data set's shape: %w", err)
	}
	return spec, nil
}

// resolveShapeTimeout bounds listing a data set's folders for its shape.
const resolveShapeTimeout = 10 * time.Minute

// parseImageSize reads --image-size HxW (or a single N for NxN).
func parseImageSize(v string) (h, w int32, err error) {
	hs, ws, ok := strings.Cut(strings.ToLower(v), "x")
	if !ok {
		ws = hs
	}
	hv, err1 := strconv.ParseInt(strings.TrimSpace(hs), 10, 32)
	wv, err2 := strconv.ParseInt(strings.TrimSpace(ws), 10, 32)
	if err1 != nil || err2 != nil || hv < 1 || wv < 1 {
		return 0, 0, fmt.Errorf("--image-size %q: want HxW with positive integers, e.g. 32x32", v)
	}
	return int32(hv), int32(wv), nil
}

// parseCompress reads --compress TYPE[:KEY=VALUE,...].
func parseCompress(v string) (*pb.CompressionSpec, error) {
	typ, opts, _ := strings.Cut(v, ":")
	c := &pb.CompressionSpec{Type: typ}
	if opts == "" {
		return c, nil
	}
	for _, kv := range strings.Split(opts, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--compress %q: %q is not KEY=VALUE", v, kv)
		}
		var err error
		switch k {
		case "rank":
			var n int64
			n, err = strconv.ParseInt(val, 10, 32)
			c.Rank = int32(n)
		case "start_iter":
			c.StartIter, err = strconv.ParseInt(val, 10, 64)
		case "min_compression_rate":
			c.MinCompressionRate, err = strconv.ParseFloat(val, 64)
		case "ratio":
			c.Ratio, err = strconv.ParseFloat(val, 64)
		case "error_feedback", "warm_start":
			var b bool
			b, err = strconv.ParseBool(val)
			if k == "error_feedback" {
				c.ErrorFeedback = proto.Bool(b)
			} else {
				c.WarmStart = proto.Bool(b)
			}
		default:
			return nil, fmt.Errorf("--compress %q: unknown key %q; allowed: rank, start_iter, min_compression_rate, error_feedback, warm_start, ratio", v, k)
		}
		if err != nil {
			return nil, fmt.Errorf("--compress %q: %s: %w", v, k, err)
		}
	}
	return c, nil
}

// splitWords splits a command line into words as a POSIX shell does for
// quotes and backslashes (no expansions): 'a b' and "a b" are one word.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated \" in %q", s)
			}
			inWord = true
		case c == '\\':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("trailing backslash in %q", s)
			}
			i++
			cur.WriteByte(s[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("no command in %q", s)
	}
	return words, nil
}
