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
//     neighbour, written by one sender goroutine one frame at a time
//     (SendRight waits until gRPC has written its frame), and watched by
//     one receiver goroutine that notices the neighbour ending the stream;
//   - inbound: the left neighbour's stream to this Endpoint, whose handler
//     (the stream's receiver) decodes frames into recycled buffers and
//     queues them in the ring's bounded inbox, where RecvLeft takes them.
//
// A full inbox stops the handler reading, so HTTP/2 flow control pushes
// back on the sender: memory per ring is bounded by InboxFrames frames of
// at most 4 MiB (internal/wire.MaxFrameBytes) each, plus the one being
// sent.
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
// Between two rings the stream uses internal/wire/framecodec's codec
// (content subtype "gradsyncframes", shared with the parameter server's
// streams) that writes and parses exactly that protobuf encoding without
// the generic proto machinery and without copying the values: a frame goes out as a few bytes of tags followed by the caller's
// []float32 itself (gRPC reference-counts it and says when it has written
// it, and only then does SendRight return), and a received frame's values
// stay in gRPC's receive buffers until RecvLeftInto adds or copies them
// into the collective's buffer (RecvLeft decodes them into a recycled
// []float32 instead). The data field's length is padded with redundant
// varint bytes so that the values arrive 4-byte aligned. On little-endian
// machines float32 slices are viewed as bytes without conversion;
// elsewhere they are converted with internal/wire.
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
