// Package ringrpc is the gRPC transport of the ring collectives: it
// implements aggregator.Ring over the Collective service, so that
// aggregator.AllReduce and friends run between worker processes.
//
// # Shape
//
// Each worker process has one Endpoint, registered on its gRPC server as the
// Collective service. An Endpoint serves many rings at once, one per job,
// keyed by job id; Join adds this process's rank of a job's ring (at one
// membership generation) to it and connects the ring:
//
//   - outbound: ONE client stream (Collective.SendFrames) to the right
//     neighbour, fed by one sender goroutine from a bounded outbox, and
//     watched by one receiver goroutine that notices the neighbour ending
//     the stream;
//   - inbound: the left neighbour's stream to this Endpoint, whose handler
//     (the stream's receiver) decodes frames into recycled buffers and
//     queues them in the ring's bounded inbox, where RecvLeft takes them.
//
// A full inbox stops the handler reading, so HTTP/2 flow control pushes
// back on the sender: memory per ring is bounded by InboxFrames and
// OutboxFrames frames of at most 4 MiB (internal/wire.MaxFrameBytes) each.
//
// # Handshake and refusal
//
// A stream names its job, generation and sender rank in request metadata.
// The Endpoint accepts it (by sending response headers, which Join waits
// for) only if that job has a ring here at exactly that generation and the
// sender is its left neighbour. Otherwise the stream ends with a status:
// unknown job (or a generation this endpoint has not joined yet) →
// NotFound, which Join retries until its context ends; older generation →
// Aborted; anything else malformed → InvalidArgument or FailedPrecondition.
// Every frame is checked again (job, generation, sender, dtype, size)
// before it reaches the inbox; a frame that fails is never delivered, so it
// is never summed, and the stream is ended with the matching code.
//
// # Wire format and copies
//
// Frames are pb.SendFramesRequest messages (TensorFrame with dtype F32 and
// raw little-endian bytes), so any gRPC client can speak to an Endpoint.
// Between two rings the stream uses a codec registered under the content
// subtype "gradsyncframes" that writes and parses exactly that protobuf
// encoding without the generic proto machinery: a frame is encoded straight
// from the caller's []float32 into a recycled buffer that gRPC writes out
// and hands back, and decoded straight from gRPC's receive buffers into a
// recycled []float32. On little-endian machines float32 slices are viewed
// as bytes without conversion (see endian_le.go); elsewhere they are
// converted with internal/wire.
//
// # Failure
//
// A neighbour that dies or closes its ring makes this ring's SendRight (the
// right neighbour) or RecvLeft (the left one) fail with an
// *aggregator.PeerError naming its rank and wrapping aggregator.ErrPeerGone.
// Frames that arrived before the break are still delivered. A ring that
// failed is not reusable: the coordinator bumps the generation and the
// ranks Join again.
//
// # Ownership
//
// A Ring owns its goroutines (sender, response watcher, and the inbound
// handler while it runs); Close stops them all and waits for those it
// started. Shutdown first lets queued frames reach the right neighbour.
package ringrpc
