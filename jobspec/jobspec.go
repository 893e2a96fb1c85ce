// Package jobspec parses, defaults and validates training job specs.
//
// A spec arrives as YAML or JSON (a file for `gradsync submit`, a JSON body
// through grpcurl) or is built from flags. Normalize fills every default and
// refuses what is wrong or not implemented yet with a *FieldError naming the
// field and what is allowed, so no option is ever silently ignored.
package jobspec

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/federated"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Defaults used when a field is zero.
const (
	DefaultModel            = "mlp"
	DefaultDataset          = "mnist"
	DefaultMode             = "ps"
	DefaultBatchSize        = 32
	DefaultEpochs           = 1
	DefaultLR               = 0.05
	DefaultMomentum         = 0.9
	DefaultSeed             = 1
	DefaultLogEvery         = 20
	DefaultStepTimeout      = 60
	DefaultSyntheticTrain   = 6000
	DefaultSyntheticTest    = 1000
	MaxWorkers              = 256
	MaxBatchSize            = 65536
	MaxEpochs               = 10000
	MaxNameLen              = 200
	defaultNonfinitePolicy  = "fail"
	defaultOptimizer        = "sgd"
	defaultSchedule         = "cosine"
	defaultCompression      = "none"
	defaultPartition        = "iid"
	defaultPSConsistency    = "sync"
	defaultAugment          = "none"
	maxStepTimeoutSeconds   = 24 * 3600
	maxLogEvery             = 1 << 20
	maxSyntheticExamples    = 1 << 20
	maxLearningRate         = 1e3
	maxGradAccumSteps       = 1024
	maxPSShards             = 64
	maxDataDirLen           = 4096
	notImplementedSuffix    = "is not implemented yet"
	allowedListSeparator    = ", "
	implementedModesMessage = "ps, ring, fedavg"
)

// Architectures every gradsync release knows by name. Those the models
// package does not build yet are refused as not implemented yet.
var Architectures = []string{"cnn", "fedcnn", "lenet5", "logreg", "mlp", "resnet8", "vit-tiny"}

// Modes are the job modes the contract defines.
var Modes = []string{"fedavg", "ps", "ring"}

// FieldError is a spec error: which field, and what is wrong or allowed.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func errf(field, format string, a ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// Parse reads a JobSpec from YAML or JSON (JSON is YAML). Field names may be
// the proto names (batch_size) or their JSON forms (batchSize). Unknown
// fields are an error.
func Parse(b []byte) (*pb.JobSpec, error) {
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("job spec is not valid YAML or JSON: %w", err)
	}
	spec := &pb.JobSpec{}
	if strings.TrimSpace(string(js)) == "null" {
		return spec, nil
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, spec); err != nil {
		return nil, fmt.Errorf("job spec: %w", err)
	}
	return spec, nil
}

// Normalize returns a copy of spec with every default filled in, or the first
// *FieldError found. models lists the architectures that can be built (the
// models package's names); nil means Architectures.
func Normalize(in *pb.JobSpec, models []string) (*pb.JobSpec, error) {
	if in == nil {
		in = &pb.JobSpec{}
	}
	s := proto.Clone(in).(*pb.JobSpec)
	if models == nil {
		models = Architectures
	}
	if len(s.Name) > MaxNameLen {
		return nil, errf("name", "is %d bytes long; at most %d allowed", len(s.Name), MaxNameLen)
	}
	// Model.
	if s.Model == "" {
		s.Model = DefaultModel
	}
	if !slices.Contains(Architectures, s.Model) {
		return nil, errf("model", "unknown model %q; allowed: %s", s.Model, strings.Join(models, allowedListSeparator))
	}
	if !slices.Contains(models, s.Model) {
		return nil, errf("model", "%q %s; available now: %s", s.Model, notImplementedSuffix, strings.Join(models, allowedListSeparator))
	}
	// Dataset.
	if s.Dataset == nil {
		s.Dataset = &pb.DatasetSpec{}
	}
	d := s.Dataset
	if d.Name == "" {
		d.Name = DefaultDataset
	}
	if !slices.Contains(DatasetNames(), d.Name) {
		return nil, errf("dataset.name", "unknown dataset %q; allowed: %s", d.Name, strings.Join(DatasetNames(), allowedListSeparator))
	}
	if len(d.DataDir) > maxDataDirLen {
		return nil, errf("dataset.data_dir", "is %d bytes long; at most %d allowed", len(d.DataDir), maxDataDirLen)
	}
	if d.SyntheticTrain < 0 || d.SyntheticTrain > maxSyntheticExamples {
		return nil, errf("dataset.synthetic_train", "%d out of range; allowed 1..%d (0: default %d)", d.SyntheticTrain, maxSyntheticExamples, DefaultSyntheticTrain)
	}
	if d.SyntheticTest < 0 || d.SyntheticTest > maxSyntheticExamples {
		return nil, errf("dataset.synthetic_test", "%d out of range; allowed 1..%d (0: default %d)", d.SyntheticTest, maxSyntheticExamples, DefaultSyntheticTest)
	}
	if d.Name == "synthetic" {
		if d.SyntheticTrain == 0 {
			d.SyntheticTrain = DefaultSyntheticTrain
		}
		if d.SyntheticTest == 0 {
			d.SyntheticTest = DefaultSyntheticTest
		}
	}
	if d.Augment == "" {
		d.Augment = defaultAugment
	}
	switch d.Augment {
	case defaultAugment, "crop", "crop-flip":
	default:
		return nil, errf("dataset.augment", "unknown augmentation %q; allowed: none, crop, crop-flip", d.Augment)
	}
	// Mode.
	if s.Mode == "" {
		s.Mode = DefaultMode
	}
	if !slices.Contains(Modes, s.Mode) {
		return nil, errf("mode", "unknown mode %q; allowed: %s", s.Mode, strings.Join(Modes, allowedListSeparator))
	}
	// Fields that fedavg replaces by its own must not be set with it.
	if s.Mode == "fedavg" {
		switch {
		case s.Epochs != nil:
			return nil, errf("epochs", "does not apply to mode fedavg; use federated.rounds and federated.local_epochs")
		case s.BatchSize != nil:
			return nil, errf("batch_size", "does not apply to mode fedavg; use federated.local_batch_size")
		case s.MaxSteps != 0:
			return nil, errf("max_steps", "does not apply to mode fedavg; use federated.rounds")
		case s.LrSchedule != nil && s.LrSchedule.Name != "" && s.LrSchedule.Name != "constant":
			return nil, errf("lr_schedule", "mode fedavg uses a constant client learning rate")
		}
		if s.LrSchedule == nil {
			s.LrSchedule = &pb.ScheduleSpec{Name: "constant"}
		}
	}
	// Workers.
	if s.Workers == nil {
		s.Workers = proto.Int32(1)
	}
	if w := s.GetWorkers(); w < 1 || w > MaxWorkers {
		return nil, errf("workers", "%d out of range; allowed 1..%d", w, MaxWorkers)
	}
	if s.MinWorkers < 0 || s.MaxWorkers < 0 {
		return nil, errf("min_workers", "must not be negative")
	}
	if s.MinWorkers == 0 {
		s.MinWorkers = s.GetWorkers()
	}
	if s.MaxWorkers == 0 {
		s.MaxWorkers = s.GetWorkers()
	}
	if s.MaxWorkers != s.GetWorkers() {
		return nil, errf("max_workers", "growing a job beyond workers (max_workers %d > workers %d) %s", s.MaxWorkers, s.GetWorkers(), notImplementedSuffix)
	}
	if s.MinWorkers > s.GetWorkers() || s.MinWorkers < 1 {
		return nil, errf("min_workers", "%d out of range; allowed 1..%d (workers)", s.MinWorkers, s.GetWorkers())
	}
	// Batches and epochs.
	if s.BatchSize == nil {
		s.BatchSize = proto.Int32(DefaultBatchSize)
	}
	if b := s.GetBatchSize(); b < 1 || b > MaxBatchSize {
		return nil, errf("batch_size", "%d out of range; allowed 1..%d (leave it out for the default %d)", b, MaxBatchSize, DefaultBatchSize)
	}
	if s.Epochs == nil {
		s.Epochs = proto.Int32(DefaultEpochs)
	}
	if e := s.GetEpochs(); e < 1 || e > MaxEpochs {
		return nil, errf("epochs", "%d out of range; allowed 1..%d", e, MaxEpochs)
	}
	if s.MaxSteps < 0 {
		return nil, errf("max_steps", "%d is negative; allowed 0 (no limit) or more", s.MaxSteps)
	}
	if err := normalizeOptimizer(s); err != nil {
		return nil, err
	}
	if s.LrSchedule == nil {
		s.LrSchedule = &pb.ScheduleSpec{}
	}
	if s.LrSchedule.Name == "" {
		s.LrSchedule.Name = defaultSchedule
	}
	switch ls := s.LrSchedule; ls.Name {
	case "constant", "cosine":
		if ls.StepSize != 0 || ls.Gamma != 0 || ls.WarmupSteps != 0 {
			return nil, errf("lr_schedule", "step_size, gamma and warmup_steps do not apply to schedule %q", ls.Name)
		}
	case "step":
		if ls.StepSize < 1 {
			return nil, errf("lr_schedule.step_size", "%d: schedule step needs step_size >= 1", ls.StepSize)
		}
		if ls.Gamma == 0 {
			ls.Gamma = 0.1
		}
		if !(ls.Gamma > 0 && ls.Gamma <= 1) {
			return nil, errf("lr_schedule.gamma", "%v out of range; allowed (0, 1]", ls.Gamma)
		}
		if ls.WarmupSteps != 0 {
			return nil, errf("lr_schedule.warmup_steps", "does not apply to schedule step")
		}
	case "warmup-linear":
		if ls.WarmupSteps < 0 {
			return nil, errf("lr_schedule.warmup_steps", "%d is negative", ls.WarmupSteps)
		}
		if ls.WarmupSteps == 0 {
			return nil, errf("lr_schedule.warmup_steps", "schedule warmup-linear needs warmup_steps >= 1")
		}
		if ls.StepSize != 0 || ls.Gamma != 0 {
			return nil, errf("lr_schedule", "step_size and gamma do not apply to schedule warmup-linear")
		}
	default:
		return nil, errf("lr_schedule.name", "unknown schedule %q; allowed: cosine, constant, step, warmup-linear", ls.Name)
	}
	if s.Seed == nil {
		s.Seed = proto.Int64(DefaultSeed)
	}
	if s.Compression == nil {
		s.Compression = &pb.CompressionSpec{}
	}
	if s.Compression.Type == "" {
		s.Compression.Type = defaultCompression
	}
	if err := compress.Validate(s.Compression); err != nil {
		return nil, errf("compression", "%v", strings.TrimPrefix(err.Error(), "compress: "))
	}
	if s.Compression.Type != defaultCompression && s.Mode != "ring" && s.Mode != "ps" {
		return nil, errf("compression.type", "%s compression in mode %s %s; use mode ring or ps", s.Compression.Type, s.Mode, notImplementedSuffix)
	}
	if err := normalizeCheckpoint(s); err != nil {
		return nil, err
	}
	if err := checkElastic(s); err != nil {
		return nil, err
	}
	if err := normalizeFederated(s); err != nil {
		return nil, err
	}
	if s.BucketCapMb != 0 {
		if !(s.BucketCapMb > 0 && s.BucketCapMb <= 1024) {
			return nil, errf("bucket_cap_mb", "%v out of range; allowed (0, 1024]", s.BucketCapMb)
		}
		if s.Mode != "ring" {
			return nil, errf("bucket_cap_mb", "gradient buckets are for ring mode")
		}
	}
	if s.Mode == "ring" && s.BucketCapMb == 0 {
		s.BucketCapMb = 25
	}
	if err := normalizePS(s); err != nil {
		return nil, err
	}
	if s.GradClipNorm != 0 {
		if s.GradClipNorm < 0 || math.IsNaN(s.GradClipNorm) || math.IsInf(s.GradClipNorm, 0) {
			return nil, errf("grad_clip_norm", "%v must be a positive number (0: off)", s.GradClipNorm)
		}
		if s.Mode == "fedavg" {
			return nil, errf("grad_clip_norm", "applies to modes ps and ring (the global gradient); fedavg clients do not clip")
		}
	}
	if s.GradAccumSteps == 0 {
		s.GradAccumSteps = 1
	}
	if s.GradAccumSteps < 1 || s.GradAccumSteps > maxGradAccumSteps {
		return nil, errf("grad_accum_steps", "%d out of range; allowed 1..%d", s.GradAccumSteps, maxGradAccumSteps)
	}
	if s.GradAccumSteps != 1 && s.Mode == "fedavg" {
		return nil, errf("grad_accum_steps", "applies to modes ps and ring; fedavg clients take one step per local batch")
	}
	if s.LogEverySteps == 0 {
		s.LogEverySteps = DefaultLogEvery
	}
	if s.LogEverySteps < 1 || s.LogEverySteps > maxLogEvery {
		return nil, errf("log_every_steps", "%d out of range; allowed 1..%d", s.LogEverySteps, maxLogEvery)
	}
	if s.EvalEveryEpoch == nil {
		s.EvalEveryEpoch = proto.Bool(true)
	}
	if s.StepTimeoutSeconds == 0 {
		s.StepTimeoutSeconds = DefaultStepTimeout
	}
	if !(s.StepTimeoutSeconds > 0 && s.StepTimeoutSeconds <= maxStepTimeoutSeconds) {
		return nil, errf("step_timeout_seconds", "%v out of range; allowed (0, %d]", s.StepTimeoutSeconds, maxStepTimeoutSeconds)
	}
	if s.NonfinitePolicy == "" {
		s.NonfinitePolicy = defaultNonfinitePolicy
	}
	if s.NonfinitePolicy != "fail" && s.NonfinitePolicy != "skip" {
		return nil, errf("nonfinite_policy", "unknown policy %q; allowed: fail, skip", s.NonfinitePolicy)
	}
	if s.Name == "" {
		s.Name = s.Model + "-" + d.Name
	}
	return s, nil
}

func normalizeOptimizer(s *pb.JobSpec) error {
	if s.Optimizer == nil {
		s.Optimizer = &pb.OptimizerSpec{}
	}
	o := s.Optimizer
	if o.Name == "" {
		o.Name = defaultOptimizer
	}
	switch o.Name {
	case defaultOptimizer, "adam", "adamw":
	default:
		return errf("optimizer.name", "unknown optimizer %q; allowed: sgd, adam, adamw", o.Name)
	}
	if o.Lr == nil {
		o.Lr = proto.Float64(DefaultLR)
	}
	if lr := o.GetLr(); !(lr > 0 && lr <= maxLearningRate) {
		return errf("optimizer.lr", "%v out of range; the learning rate must be in (0, %v]", lr, maxLearningRate)
	}
	if s.Mode == "fedavg" {
		// Clients run plain SGD at federated.client_lr (default: lr); the
		// server's optimiser is federated.strategy's.
		if o.Name != defaultOptimizer || o.Momentum != nil || o.Nesterov || o.WeightDecay != 0 || o.Beta1 != 0 || o.Beta2 != 0 || o.Eps != 0 {
			return errf("optimizer", "mode fedavg clients run plain SGD: only optimizer.lr applies (server optimisers are federated.strategy)")
		}
		return nil
	}
	if o.Name != defaultOptimizer {
		if o.Momentum != nil || o.Nesterov {
			return errf("optimizer.momentum", "momentum and nesterov are SGD settings; optimizer %q uses beta1/beta2", o.Name)
		}
		if !(o.Beta1 >= 0 && o.Beta1 < 1) || !(o.Beta2 >= 0 && o.Beta2 < 1) {
			return errf("optimizer.beta1", "betas must be in [0, 1) (0: default 0.9, 0.999)")
		}
		if !(o.Eps >= 0 && o.Eps < 1) {
			return errf("optimizer.eps", "%v out of range; allowed [0, 1) (0: default 1e-8)", o.Eps)
		}
		if !(o.WeightDecay >= 0 && o.WeightDecay < 1) {
			return errf("optimizer.weight_decay", "%v out of range; allowed [0, 1)", o.WeightDecay)
		}
		return nil
	}
	if o.Momentum == nil {
		o.Momentum = proto.Float64(DefaultMomentum)
	}
	if m := o.GetMomentum(); !(m >= 0 && m < 1) {
		return errf("optimizer.momentum", "%v out of range; allowed [0, 1)", m)
	}
	if o.Nesterov && o.GetMomentum() == 0 {
		return errf("optimizer.nesterov", "Nesterov momentum needs momentum > 0")
	}
	if !(o.WeightDecay >= 0 && o.WeightDecay < 1) {
		return errf("optimizer.weight_decay", "%v out of range; allowed [0, 1)", o.WeightDecay)
	}
	if o.Beta1 != 0 || o.Beta2 != 0 || o.Eps != 0 {
		return errf("optimizer", "beta1, beta2 and eps are Adam settings; optimizer %q does not use them", o.Name)
	}
	return nil
}

// Federated defaults.
const (
	DefaultRounds          = 10
	DefaultClients         = 10
	DefaultFraction        = 0.1
	DefaultLocalBatch      = 10
	DefaultRoundDeadline   = 60
	DefaultDirichletAlpha  = 0.5
	DefaultShardsPerClient = 2
	maxClients             = 100000
	maxRounds              = 1000000
)

// Strategies are the federated aggregation rules.
var Strategies = []string{"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "median", "trimmed-mean"}

func normalizeFederated(s *pb.JobSpec) error {
	if RealClients(s) && proto.Size(s.Partition) == 0 {
		// Real clients without a partition train on their whole local
		// training split (each worker's own --data-dir).
		s.Partition = nil
		return normalizeFederatedSettings(s)
	}
	p := s.Partition
	if p == nil {
		p = &pb.PartitionSpec{}
		s.Partition = p
	}
	if p.Type == "" {
		p.Type = defaultPartition
	}
	switch p.Type {
	case "iid", "label":
		if p.Alpha != 0 || p.ShardsPerClient != 0 {
			return errf("partition", "alpha and shards_per_client do not apply to partition %q", p.Type)
		}
	case "dirichlet":
		if p.Alpha == 0 {
			p.Alpha = DefaultDirichletAlpha
		}
		if !(p.Alpha > 0 && !math.IsInf(p.Alpha, 0)) {
			return errf("partition.alpha", "%v: the Dirichlet concentration must be positive", p.Alpha)
		}
	case "shards":
		if p.ShardsPerClient == 0 {
			p.ShardsPerClient = DefaultShardsPerClient
		}
		if p.ShardsPerClient < 1 {
			return errf("partition.shards_per_client", "%d: must be at least 1", p.ShardsPerClient)
		}
	default:
		return errf("partition.type", "unknown partitioning %q; allowed: iid, dirichlet, shards, label", p.Type)
	}
	if s.Mode != "fedavg" {
		if s.Federated != nil && proto.Size(s.Federated) > 0 {
			return errf("federated", "federated settings need mode fedavg")
		}
		if p.Type != defaultPartition {
			return errf("partition.type", "%q partitioning is for mode fedavg (ps and ring shard the data evenly)", p.Type)
		}
		return nil
	}
	return normalizeFederatedSettings(s)
}

// RealClients reports whether a fedavg spec runs real clients — one per
// worker, each training on its own data and talking to the coordinator's
// Federation service (workers ≥ 2) — rather than simulating every client
// in one worker (workers: 1).
func RealClients(s *pb.JobSpec) bool {
	return s.GetMode() == "fedavg" && s.GetWorkers() > 1
}

// normalizeFederatedSettings fills and checks a fedavg spec's federated
// settings.
func normalizeFederatedSettings(s *pb.JobSpec) error {
	if s.GetDataset().GetName() == MultiLabelMNIST {
		return errf("dataset.name", "the multi-label task with mode fedavg %s", notImplementedSuffix)
	}
	if RealClients(s) {
		// One worker is one client: K is the number of workers.
		if c := s.GetFederated().GetClients(); c != 0 && c != s.GetWorkers() {
			return errf("federated.clients", "%d, but a fedavg job on %d workers has one real client per worker; "+
				"leave clients unset (or %d), or use workers: 1 to simulate %d clients in one worker", c, s.GetWorkers(), s.GetWorkers(), c)
		}
		if s.Federated == nil {
			s.Federated = &pb.FederatedSpec{}
		}
		s.Federated.Clients = s.GetWorkers()
	}
	if s.Federated == nil {
		s.Federated = &pb.FederatedSpec{}
	}
	f := s.Federated
	if f.Rounds == 0 {
		f.Rounds = DefaultRounds
	}
	if f.Rounds < 1 || f.Rounds > maxRounds {
		return errf("federated.rounds", "%d out of range; allowed 1..%d", f.Rounds, maxRounds)
	}
	if f.Clients == 0 {
		f.Clients = DefaultClients
	}
	if f.Clients < 1 || f.Clients > maxClients {
		return errf("federated.clients", "%d out of range; allowed 1..%d", f.Clients, maxClients)
	}
	if f.Fraction == 0 {
		f.Fraction = DefaultFraction
	}
	if !(f.Fraction > 0 && f.Fraction <= 1) {
		return errf("federated.fraction", "%v out of range; allowed (0, 1]", f.Fraction)
	}
	if f.LocalEpochs == 0 {
		f.LocalEpochs = 1
	}
	if f.LocalEpochs < 1 || f.LocalEpochs > MaxEpochs {
		return errf("federated.local_epochs", "%d out of range; allowed 1..%d", f.LocalEpochs, MaxEpochs)
	}
	if f.FullBatch && f.LocalBatchSize != 0 {
		return errf("federated.local_batch_size", "cannot be set with full_batch")
	}
	if !f.FullBatch && f.LocalBatchSize == 0 {
		f.LocalBatchSize = DefaultLocalBatch
	}
	if f.LocalBatchSize < 0 || f.LocalBatchSize > MaxBatchSize {
		return errf("federated.local_batch_size", "%d out of range; allowed 1..%d", f.LocalBatchSize, MaxBatchSize)
	}
	if f.Strategy == "" {
		f.Strategy = "fedavg"
	}
	if !slices.Contains(Strategies, f.Strategy) {
		return errf("federated.strategy", "unknown strategy %q; allowed: %s", f.Strategy, strings.Join(Strategies, allowedListSeparator))
	}
	if f.Mu < 0 || math.IsNaN(f.Mu) || math.IsInf(f.Mu, 0) {
		return errf("federated.mu", "%v: must be >= 0", f.Mu)
	}
	if f.Strategy == "fedprox" && f.Mu == 0 {
		f.Mu = 0.01
	}
	if f.Mu != 0 && f.Strategy != "fedprox" {
		return errf("federated.mu", "the proximal term is FedProx's; set strategy fedprox")
	}
	if f.ServerLr < 0 || math.IsNaN(f.ServerLr) || math.IsInf(f.ServerLr, 0) {
		return errf("federated.server_lr", "%v: must be >= 0 (0: the strategy's default)", f.ServerLr)
	}
	if !(f.ServerMomentum >= 0 && f.ServerMomentum < 1) {
		return errf("federated.server_momentum", "%v out of range; allowed [0, 1)", f.ServerMomentum)
	}
	if f.ServerMomentum != 0 && f.Strategy != "fedavgm" {
		return errf("federated.server_momentum", "server momentum is FedAvgM's; set strategy fedavgm")
	}
	// Fill the server optimiser's defaults so spec.json says what ran
	// (federated/serveropt.go: FedAvgM η 0.1, β 0.9; FedAdam/FedYogi η 0.01;
	// the others η 1).
	if f.ServerLr == 0 {
		switch f.Strategy {
		case "fedavgm":
			f.ServerLr = 0.1
		case "fedadam", "fedyogi":
			f.ServerLr = 0.01
		default:
			f.ServerLr = 1
		}
	}
	if f.Strategy == "fedavgm" && f.ServerMomentum == 0 {
		f.ServerMomentum = 0.9
	}
	if f.RoundDeadlineSeconds == 0 {
		f.RoundDeadlineSeconds = DefaultRoundDeadline
	}
	if !(f.RoundDeadlineSeconds > 0 && f.RoundDeadlineSeconds <= maxStepTimeoutSeconds) {
		return errf("federated.round_deadline_seconds", "%v out of range; allowed (0, %d]", f.RoundDeadlineSeconds, maxStepTimeoutSeconds)
	}
	if f.MinClients == 0 {
		f.MinClients = 1
	}
	if f.MinClients < 1 || f.MinClients > f.Clients {
		return errf("federated.min_clients", "%d out of range; allowed 1..%d (the number of clients)", f.MinClients, f.Clients)
	}
	if f.Reweighting == "" {
		f.Reweighting = "none"
	}
	switch f.Reweighting {
	case "none":
		if f.Beta != 0 {
			return errf("federated.beta", "needs reweighting class-balanced")
		}
	case "class-balanced":
		if f.Beta == 0 {
			f.Beta = 0.999
		}
		if !(f.Beta >= 0 && f.Beta < 1) {
			return errf("federated.beta", "%v out of range; allowed [0, 1)", f.Beta)
		}
	default:
		return errf("federated.reweighting", "unknown reweighting %q; allowed: none, class-balanced", f.Reweighting)
	}
	if f.Weighting == "" {
		f.Weighting = "examples"
	}
	switch f.Weighting {
	case "examples", "uniform", "label-balanced":
	default:
		return errf("federated.weighting", "unknown weighting %q; allowed: examples, uniform, label-balanced", f.Weighting)
	}
	if f.ClientLr == 0 {
		f.ClientLr = s.GetOptimizer().GetLr()
	}
	if !(f.ClientLr > 0 && f.ClientLr <= maxLearningRate) {
		return errf("federated.client_lr", "%v out of range; allowed (0, %v]", f.ClientLr, maxLearningRate)
	}
	if f.EvalEveryRounds == 0 {
		f.EvalEveryRounds = 1
	}
	if f.EvalEveryRounds < 1 {
		return errf("federated.eval_every_rounds", "%d: must be at least 1", f.EvalEveryRounds)
	}
	if m, _ := federated.NumSampled(int(f.Clients), f.Fraction); int(f.MinClients) > m {
		return errf("federated.min_clients", "%d, but each round samples only %d of the %d clients (max(1, round(fraction %v × %d))); allowed 1..%d",
			f.MinClients, m, f.Clients, f.Fraction, f.Clients, m)
	}
	return nil
}

// MultiLabelMNIST is the multi-label task built from MNIST: two digits side
// by side (1×28×56), the target being the set of both.
const MultiLabelMNIST = "mnist-pairs"

// DatasetNames are the data sets a spec may name: data.Names() and the
// multi-label task.
func DatasetNames() []string {
	return append(data.Names(), MultiLabelMNIST)
}

// InputShape is the model shape (channels, height, width, classes) a
// normalized spec's data set needs.
func InputShape(spec *pb.JobSpec) (c, h, w, classes int) {
	if spec.GetDataset().GetName() == MultiLabelMNIST {
		return 1, 28, 56, 10
	}
	return 1, 28, 28, 10
}

// CheckpointsOn reports whether a normalized spec asks for checkpoints.
func CheckpointsOn(s *pb.JobSpec) bool {
	c := s.GetCheckpoint()
	return c.GetEverySteps() > 0 || c.GetEveryEpochs() > 0 || c.GetEverySeconds() > 0
}

func normalizeCheckpoint(s *pb.JobSpec) error {
	c := s.Checkpoint
	if c == nil {
		return nil
	}
	switch {
	case c.EverySteps < 0:
		return errf("checkpoint.every_steps", "%d is negative", c.EverySteps)
	case c.EveryEpochs < 0:
		return errf("checkpoint.every_epochs", "%d is negative", c.EveryEpochs)
	case c.EverySeconds < 0 || math.IsNaN(c.EverySeconds) || math.IsInf(c.EverySeconds, 0):
		return errf("checkpoint.every_seconds", "%v must be a number >= 0", c.EverySeconds)
	case c.Keep < 0 || c.Keep > 1000:
		return errf("checkpoint.keep", "%d out of range; allowed 1..1000 (0: default 3)", c.Keep)
	}
	if !CheckpointsOn(s) {
		if c.Keep != 0 {
			return errf("checkpoint.keep", "needs every_steps, every_epochs or every_seconds")
		}
		return nil
	}
	if c.Keep == 0 {
		c.Keep = 3
	}
	return nil
}

// checkElastic: a job that may lose workers (min_workers < workers)
// must be a ring job; its ranks recover from in-memory snapshots, and
// from its checkpoints (if it writes them) when no survivor holds one.
func checkElastic(s *pb.JobSpec) error {
	if s.MinWorkers >= s.GetWorkers() {
		return nil
	}
	if s.Mode != "ring" {
		return errf("min_workers", "elastic jobs (min_workers %d < workers %d) in mode %s %s; use mode ring", s.MinWorkers, s.GetWorkers(), s.Mode, notImplementedSuffix)
	}
	return nil
}
