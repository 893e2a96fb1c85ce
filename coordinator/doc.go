// Package coordinator is the coordinator's decision core. Core is its
// state machine for who runs what: the worker registry (address,
// resources, state, job, last heartbeat), liveness (a worker silent past
// the heartbeat timeout is lost), the queue of pending jobs and the FIFO
// gang scheduler's placements (memory-aware: a rank goes only to a
// worker whose offered memory holds what the rank needs — its pipeline
// stage, or the whole model — and a job that no connected worker can
// hold fails, naming the rank's stage, its need and the offers), and the
// job table (jobs.go): each job's
// lifecycle (PENDING → RUNNING → SUCCEEDED | FAILED | CANCELLED), its
// generation and members, which ranks finished or failed, a cancel's
// CancelTasks and the tasks an ended job still waits for, and the
// straggler rule over its progress reports, and elastic recovery
// (elastic.go): each job's Recovery, an explicit state machine (steady →
// pinning → rejoining, failing by a deadline), by which a job recovers
// from lost ranks, grows onto idle workers, and has its cut ring links
// named and the rank evicted.
//
// Where is recovery decided: here. Recovery plans a new generation's
// workers (survivors first, then idle workers, never an evicted one),
// decides when a rank's failure is final, and says what to announce
// when a generation starts; RingCulprit names the rank cut off from the
// frame counts; Stragglers applies the straggler rule. The core holds
// each job's Recovery and applies these rules; the shell (package
// server) pins the checkpoint a new generation falls back to
// (PinCheckpoint → Pinned) and announces what happened.
//
// It is written the way federated.Server and etcd's raft are: every
// input carries the time it happened (Core.Step takes Hello, Heard,
// Disconnected, Tick, Submit, Shutdown, and for jobs Loaded, Prepared,
// Progress, Started, TaskDone, Cancel, End, Pinned), and the core
// answers with what the caller must do
// (Welcome, Disconnect, WorkerLost, Place, SetState, EndJob,
// DropPrepared, StartGeneration, Assign, CancelTask, TasksStopped,
// Straggler, PinCheckpoint, Recovering, GenerationStarted, Recovered,
// RingCut) — data, never side effects. There is no
// gRPC, storage, goroutine, clock or lock in here (purity_test.go checks
// it), so every rule is tested as a script against a fake clock. The
// gRPC shell validates input, feeds the core under its lock, and carries
// out the answers — sends, store writes, run-log records, checkpoint
// pins — after releasing it, in order.
//
// A cancel ends the job at once (EndJob CANCELLED: the job's state is
// stored, and its workers are free for the next job), tells every member
// to stop (CancelTask), and says TasksStopped only once every member has
// reported its task stopped or was lost. The shell's CancelJob returns on
// TasksStopped (bounded by its StopTimeout and the call's deadline): the
// checkpoint written as the tasks stopped is then on disk, so a resume
// right after it starts from there. Waiting in the cancel rather than in
// the resume keeps that true for any client; persisting CANCELLED before
// the tasks stop keeps a second cancel or a status query answered
// without a wait (TestCancelStopsEveryMemberThenTasksStopped is the
// script; server's TestCancelThenResume does it 20 times for ring and ps).
package coordinator
