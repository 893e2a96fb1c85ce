// Package coordinator is the coordinator's decision core: the rules by
// which jobs move through their lifecycle (PENDING → RUNNING → SUCCEEDED
// | FAILED | CANCELLED), are placed on workers by the FIFO gang
// scheduler, grow onto idle workers, recover from lost ranks, and have
// their stragglers and cut ring links named.
//
// It is written the way federated.Server and etcd's raft are: every
// input carries the time it happened, and the core answers with what
// the caller must do — data, never side effects. There is no gRPC,
// storage, goroutine, clock or lock in here (purity_test.go checks it),
// so every rule is tested as a script against a fake clock. The gRPC
// shell (package server) validates input, feeds the core under its
// lock, and carries out the answers — store writes, run-log records,
// checkpoint pins, sends — after releasing it.
package coordinator
