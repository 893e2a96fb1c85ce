// Package stage runs one pipeline stage: an Executor walks its stage's
// list of a pipeline.Plan every step — Forwards and Backwards of the
// step's micro-batches, receiving and sending activations and activation
// gradients over Links to the neighbouring stages — and the last stage
// computes the loss. Link is the transport: Pipe makes an in-process link
// over channels (this package), pipeline/peerrpc one over a gRPC stream
// between workers.
//
// # One worker, exactly
//
// A step of S executors gives, bit for bit, the gradient of one worker
// that clears its gradients and then, for mb = 0, 1, …, M−1, runs Forward
// on micro-batch mb (samples [mb·k, (mb+1)·k) of the batch, k = batch/M),
// takes the mean loss of the micro-batch and its gradient with respect to
// the logits, multiplies that gradient by float32(k)/float32(batch) (when
// M > 1) and runs Backward, adding into its gradient buffer: the worker's
// gradient accumulation with grad_accum_steps = M (worker.forwardBackward),
// whose sum is the gradient of the whole batch's mean loss. The step's
// loss is Σ loss_mb·k / batch, in float64, as the worker's. Dropout
// masks are those of that worker's training Forward number step·M + mb
// (the trainer sets step·M before a step), batch-norm statistics are per
// micro-batch and move in micro-batch order. It rests on three things:
// models.ForwardStage/BackwardStage run a cut network bit for bit as the
// whole one; every stage backwards its micro-batches in order 0, …, M−1
// under both schedules (package pipeline), so each parameter's gradient
// is summed in the worker's order; and each micro-batch in flight runs
// on its own models.Network.Twin, which shares the stage's parameters,
// gradients and batch-norm buffers but holds that micro-batch's
// activations until its Backward. It is not bit-identical to one
// Backward of the whole batch at once (GEMMs sum the batch in another
// order), nor, with batch norm, equal to it at all.
//
// # Evaluation
//
// Infer runs samples forward only, in evaluation mode, in micro-batches
// of the training micro-batch's size, through the same links (its
// messages are marked Eval, so a stage that expects a training step's
// refuses them): the logits are, bit for bit, those of the worker's
// network on the same micro-batches.
//
// # Bounded memory
//
// New builds one twin per micro-batch the plan holds in flight at once on
// the stage — M under GPipe, min(M, S−s) on stage s under 1F1B, counted
// from receiving a micro-batch's activation (starting its Forward on the
// first stage) to sending its input gradient (ending its Backward) — and
// a Step never holds more (Stats.PeakInFlight). Links hold a bounded
// number of messages; every valid plan runs with any capacity, rendezvous
// included (package pipeline's proof).
//
// # Failure
//
// Every Send and Recv takes the step's context. A step that fails — a
// broken link, a message that is not the one the plan expects next (a
// *HeaderError: wrong step, micro-batch, direction or shape), a passed
// deadline — aborts both of the stage's links with its *StepError, so the
// neighbours fail at once with a *PeerError naming this stage instead of
// waiting for their deadlines, and so on down the pipeline. A failed
// executor and its links are not reused: the job starts a new generation.
package stage
