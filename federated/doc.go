// Package federated is the pure core of gradsync's federated mode: FedAvg
// rounds over many clients whose data is not identically distributed.
// Nothing here does I/O, reads the clock, draws unseeded randomness or
// starts goroutines; the gRPC Federation service and the in-process
// simulator are shells over it.
//
// # One round
//
//  1. The server samples the round's clients: SampleClients draws
//     max(1, round(C·K)) of the K clients without replacement, a pure
//     function of (seed, round).
//  2. Each sampled client copies the global parameters w_g into its model,
//     trains E local epochs of SGD with batch B on its own data — adding
//     AddProximal's μ(w − w_g) to every gradient for FedProx, and weighting
//     its loss with ClassBalancedWeights of its label histogram when
//     reweighting is on — and sends an Update: Δ_k = w_k − w_g (a flat
//     []float32 in the model's parameter layout), its example count and
//     label histogram.
//  3. The Server state machine (server.go) accepts the round's updates,
//     refusing stale, unknown, duplicate and malformed ones with typed
//     errors, and closes the round when every sampled client has answered,
//     or at the deadline if at least MinClients have; otherwise the round
//     fails and the next round number is opened with a fresh sample, up to
//     MaxRetries failures in a row.
//  4. Closing a round runs the Strategy: a Weighting gives each update a
//     weight (example count, uniform, or label-balanced); a Rule combines
//     the deltas into one pseudo-gradient Δ (weighted Mean, Median,
//     TrimmedMean); a ServerOptimizer moves w_g by Δ (ServerSGD — FedAvg
//     with η = 1 —, ServerMomentum for FedAvgM, Adaptive for FedAdam and
//     FedYogi). Updates are processed sorted by client ID and accumulated
//     in float64, so the new parameters are bit-identical whatever order
//     the updates arrived in.
//
// # Driving the Server
//
// Like etcd's raft node, the Server takes inputs stamped with the caller's
// clock and returns Actions for the shell to carry out, in order:
//
//	acts, _ := srv.Start(now)           // *OpenRound: send Global to Clients, arm a timer for Deadline
//	acts, err := srv.Submit(now, u)     // an update arrived; err is a refusal (or the job's failure)
//	acts, err := srv.Tick(now)          // the timer fired
//
// and the actions *RoundClosed (new parameters, participants, stragglers,
// Stats), *RoundFailed and *Finished. Errors map to gRPC codes at the edge:
// *StaleRoundError → Aborted, *UnknownClientError and *InvalidUpdateError →
// InvalidArgument, ErrDuplicate → AlreadyExists, ErrNotRunning →
// FailedPrecondition.
//
// # Simulation
//
// Simulate runs a whole job in process over a data.Dataset split with a
// data.Partition* partitioner: the same Server on a virtual clock, the
// clients trained one after another on one models.Network, optional
// stragglers, and a test-set evaluation every EvalEvery rounds, returning
// a History of per-round records (accuracy, loss, participants, update
// norm, participants' label histograms).
//
// # Strategies and defaults
//
// FederatedSpec.strategy names map to NewStrategy:
//
//	fedavg        Mean by example count, x ← x + Δ                   (McMahan et al. 2017)
//	fedprox       as fedavg; clients add μ/2‖w − w_g‖², μ default 0.01 (Li et al. 2020)
//	fedavgm       v ← βv + Δ, x ← x + ηv; η 0.1, β 0.9                (Hsu et al. 2019)
//	fedadam       η 0.01, β1 0.9, β2 0.99, τ 1e-3, v₀ = τ²            (Reddi et al. 2021)
//	fedyogi       as fedadam with Yogi's additive second moment
//	median        coordinate-wise median, unweighted                 (Yin et al. 2018)
//	trimmed-mean  coordinate-wise β-trimmed mean, β 0.1, unweighted   (Yin et al. 2018)
package federated
