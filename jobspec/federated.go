package jobspec

import (
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/federated"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

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

// checkFedAvgClasses refuses a fedavg job over a label space so wide that
// a round's record (every participant's label histogram) would not fit
// one message: its clients hold any label space in memory, but the round
// records travel whole.
func checkFedAvgClasses(s *pb.JobSpec) error {
	k := int(s.GetDataset().GetShape().GetClasses())
	if s.Mode != "fedavg" || k <= 256 {
		return nil
	}
	f := s.GetFederated()
	m, _ := federated.NumSampled(int(f.GetClients()), f.GetFraction())
	if m*k > MaxRoundHistogramCounts {
		return errf("federated.fraction", "%d clients per round × %d classes = %d label-histogram counts in each round's record, at most %d; sample fewer clients per round, or use mode ps or ring",
			m, k, m*k, MaxRoundHistogramCounts)
	}
	return nil
}

// checkFedAvgMultiLabel refuses what fedavg cannot do on a multi-label
// streamed set (a labels.csv): its simulated clients train it with BCE,
// but the label partitioners deal one label per example, class-balanced
// reweighting weighs a softmax cross-entropy, and real clients' own
// evaluation is single-label.
func checkFedAvgMultiLabel(s *pb.JobSpec) error {
	d := s.GetDataset()
	if s.Mode != "fedavg" || !Streamed(d) || !d.GetShape().GetMultiLabel() {
		return nil
	}
	switch {
	case RealClients(s):
		return errf("workers", "%d real clients on a multi-label data set %s; simulate the clients in one worker (workers: 1), or use mode ps or ring", s.GetWorkers(), notImplementedSuffix)
	case s.GetPartition().GetType() != "iid":
		return errf("partition.type", "%q deals one label per example; a multi-label data set is partitioned iid", s.GetPartition().GetType())
	case s.GetFederated().GetReweighting() == "class-balanced":
		return errf("federated.reweighting", "class-balanced weighs a softmax cross-entropy; a multi-label data set trains with BCE, each client weighing positives by its own data")
	}
	return nil
}
