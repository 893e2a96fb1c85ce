// Package aggregator turns many contributions into one.
//
// # Ring collectives
//
// AllReduce, AllGather, Broadcast and Barrier are pure algorithms over flat
// []float32 buffers and a two-method neighbour transport, Ring: a rank sends
// to its right neighbour (rank+1 mod n) and receives from its left
// (rank−1 mod n). NewMemRing is an in-memory Ring; the gRPC transport
// (ringrpc) and the shared-memory one for ranks on one host (shmring) are
// thin adapters that implement the same interface. The package ringtest
// holds the correctness suite every Ring implementation must pass.
//
// # The AllReduce schedule
//
// With n ranks and a buffer of L elements, the buffer is cut into n
// contiguous ring chunks in rank order (the chunk arithmetic of gloo's
// allreduce_ring, with the remainder spread so sizes differ by at most one):
//
//	base, rem := L/n, L%n
//	off(c)  = c*base + min(c, rem)
//	size(c) = base + (1 if c < rem else 0)
//
// so chunks are empty when L < n, and L = 0 or n = 1 sends nothing. The
// 2(n−1) global ring steps g = 0 … 2n−3 are uniform: at step g, rank r sends
// chunk (r−g) mod n and receives chunk (r−g−1) mod n.
//
//   - Reduce-scatter, g = 0 … n−2 (PhaseReduceScatter): the received partial
//     sum is added into the local chunk. Chunk c starts at rank c and
//     accumulates rank by rank, so after step n−2 rank r holds the complete
//     sum of chunk (r+1) mod n, computed exactly once, in the fixed order
//     c, c+1, …, c−1.
//   - All-gather, g = n−1 … 2n−3 (PhaseGather): the received final chunk
//     overwrites the local one. Every rank ends up with the same bits as the
//     rank that computed the sum; float addition is never repeated, so the
//     results are bit-identical on all ranks.
//
// The chunk received at step g is the chunk sent at step g+1. Each chunk is
// therefore sent as sub-chunks (frames) of at most Options.MaxFrameElems
// elements (default 1 MiB of float32; at most 4 MiB), and each sub-chunk is
// forwarded as soon as it has been received and reduced: sending and
// receiving overlap, and for large buffers the ring is a pipeline rather
// than 2(n−1) store-and-forward steps. Each rank sends about 2(n−1)·L/n
// elements in total.
//
// Every frame carries {generation, op, step, phase, chunk, offset} and its
// length; the receiver knows exactly which frame comes next and rejects any
// other with ErrUnexpectedFrame before touching its data.
//
// AllGather runs the all-gather half alone over n equal blocks (rank r
// starts by sending its own block r). Broadcast pipelines the buffer along
// the chain root → root+1 → … → root−1. Barrier passes an empty token n−1
// hops, each hop sent only after the previous one has arrived.
//
// # Concurrency
//
// Within a call, the calling goroutine receives and computes while one
// sender goroutine owned by the call drains a queue sized to hold every
// frame of the call. The receiver therefore never waits on the right
// neighbour, so the ring cannot deadlock whatever the links buffer. On
// success the call waits until all its frames were handed to SendRight; on
// failure it cancels the sender and waits for it. No goroutine outlives a
// call. A Ring carries one collective at a time.
//
// # Peer-to-peer all-reduce
//
// For small and medium buffers the ring's 2(n−1) message latencies
// dominate. Peers is a transport in which any rank may send to any other
// (contract on Peers, written as Ring's); over it AllReduceHalvingDoubling
// (recursive halving then doubling, non-power-of-two worlds folded onto
// the largest power of two) and AllReduceTree (binary-tree reduce then
// broadcast) need about 2·log2(n) latencies. AllReduceWith runs any
// Algorithm over a Peers (the ring through PeerRing); a CostModel picks
// one per world and size (Choose) and says why. Implementations:
// NewMemPeers, and NewPairPeers over one two-rank Ring per pair: the
// shmring and ringrpc tests pass the suite with two-rank shared-memory
// and gRPC rings (ringrpc on bufconn), and `gradsync bench allreduce
// --transport shm-pairs` sets up shared-memory pairs in one process; no
// worker sets up pairs yet, so training runs the ring. The package
// peertest is the suite every algorithm × Peers implementation passes.
// As the ring's, these algorithms compute every sum once, on one rank,
// and copy it everywhere else: results are bit-identical on all ranks,
// though the summation order (a tree) differs from the ring's, so the
// last bits may differ from AllReduce's.
//
// A peer algorithm that fails because a rank is gone sends the peers of
// its call an abort notice naming that rank (PhaseAbort), and they pass
// it on, so every survivor fails with a *PeerError naming the dead rank,
// not only the ranks that talked to it.
//
// A neighbour that dies makes the adjacent ranks fail with a *PeerError
// (wrapping ErrPeerGone) naming it; ranks further away fail when their
// context expires, so every collective should run under a deadline. After a
// failure the ring is not reusable: the coordinator bumps the generation and
// a new ring is built.
package aggregator
