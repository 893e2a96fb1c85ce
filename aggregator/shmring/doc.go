// Package shmring is the shared-memory transport of the ring collectives:
// it implements aggregator.Ring (and aggregator.ReducingRing) between
// ranks on one host, where memory bandwidth rather than loopback TCP is
// the limit. gRPC stays the control plane: the negotiation that decides
// to use this transport runs over the authenticated Collective stream and
// carries each rank's Offer to its right neighbour; this package is the
// data plane that follows.
//
// # Segments
//
// Each directed link r → r+1 is one file in a tmpfs directory
// (DefaultDir, /dev/shm), created by rank r with O_EXCL and mode 0600 and
// mapped MAP_SHARED by both ranks, and two FIFOs beside it (the file's
// name + ".data" and + ".space", also 0600), its bells: see Protocol. Its
// layout (little-endian):
//
//	0     segment header: magic "GSSHMRNG", version, data offset, slot
//	      count and size, total size, generation, from/to ranks, ring
//	      size, creator pid, 16-byte nonce, SHA-256 of the job id, and
//	      an HMAC-SHA256 of all of it under the job secret
//	512   head   u64   frames published (written by the sender only)
//	576   tail   u64   frames consumed (written by the receiver only)
//	640   (unused) + "receiver asleep" word
//	704   (unused) + "sender asleep" word
//	768   sender closed, receiver closed
//	832   attach state (futex word), attacher pid and rank
//	896   attacher's token: HMAC-SHA256(secret, nonce, rank, pid)
//	960   time of the sender's last publish (statistics only)
//	4096  Slots slots of SlotSize bytes: a 64-byte frame header, then
//	      the frame's float32 values in the machine's byte order (both
//	      ends are on one host)
//
// Every control word sits on its own cache line, so the sender's and the
// receiver's stores never share one. The frame header carries the ring
// Frame's tags (generation, op, step, phase, chunk, offset), the value
// count, the frame's sequence number on the link and a CRC-32C of the
// header.
//
// # Protocol
//
// A link is a single-producer single-consumer ring of slots. SendRight
// waits until head−tail < Slots (backpressure), copies the values into
// slot head mod Slots, writes the header, then publishes head+1.
// RecvLeftInto waits until head > tail, checks the header and adds (or
// copies) the values straight from the slot into the collective's buffer
// — the one copy on each side is the whole cost — then publishes tail+1.
// RecvLeft copies into a private buffer instead.
//
// A waiter first spins briefly on the counter, then sleeps on the link's
// bell for its direction (a read of the FIFO through Go's network poller)
// after saying so in the "asleep" word; the other side, after
// publishing, rings the bell (writes a byte) only if it said so, so a busy
// link makes no system calls. Sleeps are bounded by 20 ms so that a
// waiter notices its context ending and a neighbour process dying
// without any other goroutine.
//
// Why FIFOs and not futexes (which the first version slept on): a futex
// sleep is a system call, and a goroutine in a system call keeps its P
// until the runtime's monitor takes it back, which is slow when the
// monitor has backed off; meanwhile the ring's other goroutines (the
// collective's sender) and the step's compute wait for a P. A read
// through the poller parks only the goroutine. With ranks as goroutines
// of one process (as in `gradsync local`), 2 Ps, a 4 KiB all-reduce took
// 450–850 µs on futexes and 64–220 µs on bells, 16 MiB 14–16 ms against
// 6–7 ms (BenchmarkAllReduceSHM, interleaved, at load ≈ 20: indicative).
//
// # Setup and authentication
//
// HostID says which neighbours may try the transport at all (same
// kernel, same segment directory, same pid namespace, same user).
// Create makes rank r's outbound segment and its bells and returns its
// Offer (file name, rank, pid, nonce: no secret). Connect, given the left
// neighbour's offer, opens and maps that segment and opens its bells,
// refuses them unless the segment is a 0600 regular file of this user
// whose header is well-formed, authenticated with the job secret and
// names this job, generation and link, and the bells are 0600 FIFOs of
// this user; then it unlinks all three and writes its own token. (A
// process of the same user could write to a bell while it has a name:
// that only wakes a waiter, which then finds its counters unchanged.) It then waits for
// the right neighbour to do the same on rank r's segment, checks that
// token (a process without the secret is refused and logged: it may read
// the memory, as any process of the same user could, but no frame is
// ever sent through it), and waits until its own attach was accepted.
// Any failure ends with ErrRefused or ErrCorrupt in the error and
// nothing left in the directory; the caller then stays on gRPC.
//
// # Lifetime and failure
//
// Segments are unlinked as soon as both sides have mapped them, so once
// Connect returns a kill -9 of either process leaves nothing in the
// directory (a process killed between Create and its neighbour's attach
// leaves its segment until that neighbour's Connect removes it or gives
// up; a crash of both in that window leaves a file, which the next
// Create on the host removes: see Sweep).
//
// A neighbour is gone when it set its closed word (Close) or its process
// exited, which is watched through a pidfd opened at attach time (so a
// reused pid cannot pass for it). A waiting SendRight or RecvLeft checks
// the processes of both neighbours, not only of the one it talks to, so
// that both neighbours of a dead rank fail at once with a
// *aggregator.PeerError naming it and wrapping aggregator.ErrPeerGone;
// a Close counts only on the link it closes, because a neighbour that is
// done closes while this rank may still send its last frames the other
// way. Frames published before the break are still delivered. A header or counter that breaks the protocol is refused with
// a *aggregator.PeerError wrapping ErrCorrupt and its data is never used.
//
// # Ownership
//
// A Ring owns its two mappings and pidfds and starts no goroutines. Close
// marks both links closed, wakes every sleeper, waits for this rank's
// calls in progress to return, and only then unmaps.
package shmring
