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

	"github.com/gradsync/gradsync/data"
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
var Architectures = []string{"cnn", "convvit", "fedcnn", "lenet5", "logreg", "mlp", "mobilenet", "mobilenet-0.5", "resnet18", "resnet8", "se-resnet8", "vit-tiny"}

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
	if err := normalizeDataset(d); err != nil {
		return nil, err
	}
	// Mode.
	if err := normalizeEntrypoint(s); err != nil {
		return nil, err
	}
	if s.Mode == "" {
		s.Mode = pipelineMode(s)
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
		s.Workers = proto.Int32(pipelineWorkers(s))
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
	if err := checkCompression(s.Compression); err != nil {
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
	if err := checkEntrypointFedAvg(s); err != nil {
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
	if err := checkFedAvgMultiLabel(s); err != nil {
		return nil, err
	}
	if err := checkFedAvgClasses(s); err != nil {
		return nil, err
	}
	if err := checkModelShape(s); err != nil {
		return nil, err
	}
	switch s.ActivationCheckpointing { // models.ParseCheckpointing's names
	case "", "none", "blocks", "sqrt":
	default:
		return nil, errf("activation_checkpointing", "unknown mode %q; allowed: none, blocks, sqrt", s.ActivationCheckpointing)
	}
	switch s.Precision { // models.ParsePrecision's names
	case "", "fp32":
	case "bf16", "fp16":
		if !lowPrecisionChecked(s.Model) {
			return nil, errf("precision", "%s is not yet checked for model %s (its low-precision gradients are outside the engine's bounds); use fp32", s.Precision, s.Model)
		}
		if s.Precision == "fp16" && s.Mode == "ps" {
			return nil, errf("precision", "fp16 (with its loss scaler) runs in modes ring and fedavg (a scaler per client's local run) only so far; bf16 needs no scaler and runs in ps mode too")
		}
		switch t := s.Compression.GetType(); {
		case s.Precision != "fp16", t == "none", t == "fp16", t == "bf16":
		default:
			// their error feedback would keep residuals at the loss scale
			// of the step that made them
			return nil, errf("precision", "fp16 takes compression none, fp16 or bf16 (not %s, whose error feedback would mix loss scales)", t)
		}
	default:
		return nil, errf("precision", "unknown precision %q; allowed: fp32, bf16, fp16", s.Precision)
	}
	if err := normalizePipeline(s); err != nil {
		return nil, err
	}
	if err := normalizeCollective(s); err != nil {
		return nil, err
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

// MultiLabelMNIST is the multi-label task built from MNIST: two digits side
// by side (1×28×56), the target being the set of both.
const MultiLabelMNIST = "mnist-pairs"

// DatasetNames are the data sets a spec may name: data.Names(), the
// multi-label task and data.SourceNames(), sorted.
func DatasetNames() []string {
	names := append(append(data.Names(), MultiLabelMNIST), data.SourceNames()...)
	slices.Sort(names)
	return names
}
