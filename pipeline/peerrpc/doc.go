// Package peerrpc carries pipeline stages' activations and activation
// gradients between workers: a stage.Link over the Pipeline service's
// Exchange stream (proto/gradsync/v1/pipeline.proto).
//
// # Shape
//
// Each worker registers one Endpoint on its gRPC server. The link
// between stages s and s+1 is ONE bidirectional stream, opened by stage s
// (Dial, over its connection to s+1's worker) and accepted by stage s+1
// (Endpoint.Accept): activations go down it, their gradients come back up
// it. The stream's metadata names the job, the generation and the sending
// stage; the endpoint accepts it (a response header, which Dial waits
// for) only if that stage+1 of that job waits for exactly that
// generation: no one waiting, or a newer generation than the one
// waiting → NotFound, which Dial retries until its context ends; an older
// generation → Aborted; malformed metadata → InvalidArgument.
//
// Each end runs one sender goroutine, the stream's only writer, fed by
// Send through a channel of two frames, and one receiver goroutine that
// checks every frame's link tags (job, generation, sending stage,
// direction) and queues it in a bounded inbox (InboxFrames), where Recv
// takes it; a full inbox stops the receiver reading, so HTTP/2 flow
// control holds the sender back. Memory per link is bounded by the
// inbox, the sender's queue and the frame being written, each at most
// FrameElems values (1 MiB).
//
// # Frames and refusals
//
// Send cuts a tensor into PipelineFrames of at most FrameElems values,
// each tagged with job, generation, stage, direction, step, micro-batch,
// the whole tensor's shape and the frame's offset; the last is marked.
// Recv checks every frame against what the stage's plan expects next
// (stage.Header.Check, then offsets in order, sizes, the last frame
// ending the tensor). A frame that fails is never used: the link breaks,
// Recv returns a *stage.PeerError wrapping the *stage.HeaderError, and
// the peer hears why — Aborted for an earlier generation or step,
// InvalidArgument otherwise.
//
// # Failure
//
// A link broken by either end, by its peer's worker going away or by a
// refused frame fails every pending and later Send and Recv of both ends:
// the peer's with a *stage.PeerError naming this stage and wrapping
// stage.ErrPeerGone. The reason travels with it: the server end (stage
// s+1) ends the stream with a status carrying it, the client end sends a
// last frame with the reason in abort, half-closes, and cancels the
// stream after abortGrace if the peer does not end it first. So an
// executor's abort names, down the whole pipeline, the stage that failed
// first. A link is not reusable: the job joins a new generation.
//
// # Ownership
//
// A Link owns its two goroutines; Close ends its stream and waits for
// them. The server end's stream lives as long as the Exchange handler,
// which returns once the link is broken or closed.
package peerrpc
