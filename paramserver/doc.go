// Package paramserver is the ParameterServer gRPC service (ps mode)
// over package aggregator's shard cores: the coordinator hosts a job's
// shards (Group, created per job generation, behind the small Env of
// its host), or each shard runs as its own `gradsync aggregator`
// process (ShardServer), which learns the job from the first rank's
// join.
//
// A rank's Sync stream to one shard: the join; then, per step, the
// parameters down (after the previous step), the rank's gradient up,
// in one push or PowerSGD's two with the server's P in between, as
// paramserver/psstep plans them; with consistency sync every rank waits
// for the others' pushes of each phase, with async or bounded each
// gradient is applied when it is in. A due checkpoint is written by the
// stream of the rank whose push completed the step, after gathering the
// ranks' own compression state when there is some.
//
// This package is the shell: streams, frames, locks, waits, the step
// timeout, disk writes. The decisions and the arithmetic of a step are
// psstep's, shared with the worker's side: what a phase's pushes combine
// into and what the shard answers (psstep.Shard, driven by stream.go's
// recvPhase and shard.go's serve), whether a checkpoint is due
// (psstep.Checkpoints, checkpoint.go), how late each rank's push arrives
// (psstep.Lags, read by Group.TakeLag). Every receive loop takes the
// stream's context and returns once it ends.
//
// An entrypoint job in mode ps has no model on the server: its shards
// (Sums, sums.go, hosted by the coordinator, or one each by
// ShardServer.Reduce) are summation servers for
// the script's collective calls over Reduce streams, and ScriptClient
// (sumsclient.go) is a rank's side, the agent's Collective in mode ps;
// psstep.Calls is their arithmetic.
package paramserver
