// Package federation is the coordinator's driver of federated rounds with
// real clients: it serves Federation.Participate and carries out
// federated.Server's actions. The decisions about rounds (sampling,
// deadlines, aggregation, min_clients) are federated.Server's; this
// package feeds it the clients' joins, updates and losses and the time,
// and turns its actions into messages on the clients' streams, run-log
// records, events and checkpoints. It reaches the rest of the coordinator
// only through the Coordinator interface.
//
// A fedavg job with real clients (workers ≥ 2, jobspec.RealClients) runs
// its rounds here: every worker is one client (client index = rank) on a
// Federation.Participate stream.
//
//   - The first round opens when every client has joined (or is lost), or
//     one round deadline after the job started with those that have.
//   - Each round, every connected client hears of it (RoundStart); the
//     sampled ones get the global model and train. A sampled client that
//     is not connected, or never answers, is missing when the round closes
//     at its deadline; a round with fewer than min_clients answers fails,
//     and so does the job (as in the simulation).
//   - An update for a round that has closed is refused with Aborted and
//     counted (late when its client was sampled and missing); the client
//     joins again for later rounds.
//   - The coordinator has no data of its own, so the global model is
//     evaluated by the evaluator: the connected client with the lowest
//     index (client 0 while it is up), on its own test split, after every
//     eval_every_rounds closed rounds and after the last. Its results are
//     recorded as the simulation's are (metrics.jsonl round records,
//     charts, events); the job ends SUCCEEDED with the final evaluation.
//   - A worker lost is a client missing from the rounds it is sampled
//     for, not a failure; the job fails only when every client is gone.
//     A round does not wait for its lost clients: it closes as soon as the
//     others have answered (federated.Server.Drop), before its deadline.
//   - With checkpoints the driver writes one after a closed round when
//     the spec says (jobspec.CheckpointDue; a round is a step and an
//     epoch, every_seconds is checked as rounds close), and when the job
//     is cancelled or fails or the server shuts down (Driver.SaveStopped):
//     the simulation's format (federated.SaveCheckpoint) — the global
//     parameters, the server optimiser's state, the rounds closed. The
//     coordinator has no batch-norm statistics of its own (each client
//     keeps its running mean and variance): a checkpoint holds the buffers
//     the job started with (the model's initial ones, or those of the
//     checkpoint it resumed from), and a resumed job's clients start
//     theirs afresh.
//   - A resume (submit --resume, or a server restart's requeue) starts the
//     rounds after the checkpoint's with its global model and server
//     state, once the clients join again; with every client answering it
//     is the undisturbed run, bit for bit, on models without batch norm.
//     The evaluation of a round that closed before the checkpoint but was
//     not yet recorded is lost, except the last round's, which a resumed
//     job asks for before it ends.
//   - An entrypoint job's clients are scripts (gradsync.fl): the
//     coordinator has no model (Config.Net is nil). Each client joins
//     with its parameters' layout and initial values; the first join sets
//     the layout, a join whose layout differs is refused (InvalidArgument
//     naming the tensor), and the global model starts from the initial
//     parameters of the lowest-index client that joined before the first
//     round (entry.go). No checkpoints (jobspec refuses them).
//   - A client that can no longer take part (its script crashed or hung)
//     says so with ClientLeave: it is lost from then on, as a lost
//     worker's client is, and named in the job's events.
//
// # Locks and goroutines
//
// A Driver has one mutex, which guards its round state and its sessions;
// it never calls the Coordinator while holding it. What it asks of the
// Coordinator is queued under the lock, in the order decided, and carried
// out by the goroutine running Driver.Run after unlocking, one call at a
// time. So the Coordinator may hold its own lock while it calls the
// Driver (Abort, WorkerLost, SaveStopped take the Driver's lock, or none),
// and take that lock in its Coordinator methods, without a deadlock: the
// lock order is the coordinator's, then the driver's.
//
// Goroutines: Run (the clock and the Coordinator calls; its caller owns
// it, and it returns once the driver is aborted and its streams' receive
// loops have ended) and one receive loop per Participate stream beside
// its handler (Run waits for them).
package federation
