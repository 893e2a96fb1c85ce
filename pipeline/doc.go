// Package pipeline is the pure core of pipeline parallelism: a model
// split by layers into S stages, one per worker, trained on M
// micro-batches per step. It holds the schedules — in what order each
// stage runs its forwards, backwards and transfers — as plans of
// actions, separated from the stages that run them (as in
// torch.distributed.pipelining, where a PipelineStage is what runs and a
// Schedule in what order). Nothing here does I/O, reads the clock, draws
// unseeded randomness or starts goroutines: a stage's shell walks its
// list, and Simulate runs all lists together on a fake clock for tests
// and cost estimates. How a model is cut into stages is
// models.Partition.
//
// The runtime lives in subpackages: pipeline/stage's Executor is the
// shell that walks one stage's list every step over a Link to each
// neighbour (in process: stage.Pipe; between workers: pipeline/peerrpc,
// one gRPC stream per link), and pipeline/stage/stagetest checks any
// link against one worker, bit for bit. Pipeline jobs (the spec, the
// placement, the worker's stage) are described below.
//
// # Plans
//
// GPipe(S, M) and OneFOneB(S, M) return a Plan: for every stage s, an
// ordered list of Forward(mb), Backward(mb) and the transfers they imply
// — RecvActivation(mb) from s−1 before Forward(mb), SendActivation(mb) to
// s+1 after it, RecvGrad(mb) from s+1 before Backward(mb), SendGrad(mb) to
// s−1 after it (none on the side where a stage has no neighbour). The
// last stage computes the loss of a micro-batch between its Forward and
// its Backward. Both schedules flush: every micro-batch is backwarded
// before the step ends and the optimiser steps once, on the whole
// batch's gradient. Plans are valid for any S ≥ 1 and M ≥ 1, M < S
// included (1F1B's warm-up is then cut to M forwards: min(S−1−s, M)).
//
// # Gradient accumulation order
//
// Every stage runs its backwards in micro-batch order 0, 1, …, M−1 under
// both schedules, so the stage's gradient is ((g₀ + g₁) + g₂) + … in that
// order, whatever the delays. That order decides the bits: a pipeline
// step gives bit for bit the gradient of one worker that runs the same M
// micro-batches one after another, accumulating into the same buffer,
// and GPipe and 1F1B give the same bits. (It is not bit-identical to one
// full-batch backward, whose GEMMs sum the batch in another order, nor
// with batch norm, whose statistics are per micro-batch.)
//
// # Why no plan deadlocks
//
// Each direction of each link (activations s → s+1, gradients s+1 → s)
// is a FIFO channel. Validate checks, and the tests prove for S 1..8 and
// M 1..16, two properties:
//
//  1. On every channel, the sender's plan sends the micro-batches in the
//     same order as the receiver's plan receives them, so the k-th send
//     is the k-th receive's message.
//  2. Taking each matched send/receive pair as one event shared by its two
//     stages, the stages' orders together are acyclic: there is one
//     global order of all events that every stage's list follows.
//
// With both, no capacity ≥ 0 can deadlock. Take any state where some
// stage has not finished and, in the global order, the first event e not
// yet completed. Every event before e has completed, so every stage
// taking part in e is at e (its earlier actions precede e). A computation
// can run. For a transfer, the receiver is at its receive; every earlier
// message on that channel was sent and received by earlier events, so the
// channel holds at most e's message. If it holds it, the receive
// completes; if not, the sender is at its send and the channel is empty,
// so a send with capacity ≥ 1 completes, and with capacity 0 (a
// rendezvous) both ends are there and it completes. So some action can
// always run, with any delays: bounded buffers suffice, down to none.
// Validate checks property 2 by running the plan with rendezvous links,
// which gets stuck exactly when there is a cycle.
//
// The one place the order needs care is 1F1B's steady phase. Stage s+1
// sends gradient i before it receives activation w+i; if stage s sent
// activation w+i right after computing it and only then waited for
// gradient i, each would wait for the other on a rendezvous link (and
// with one slot of buffer the order would be fine, which is how such
// deadlocks hide until a link is full: pytorch#172668, Megatron-LM#5100).
// OneFOneB therefore places SendActivation(w+i) after RecvGrad(i); it
// costs nothing, since s+1 wants that activation only after it has sent
// the gradient.
//
// # What the simulator shows
//
// Simulate counts, per stage, the micro-batches whose activations are
// held (forwarded, not yet backwarded): the peak is M under GPipe and
// min(M, S−s) on stage s under 1F1B. With forward f and backward b on
// every stage and free transfers, a step lasts (M+S−1)(f+b) and each
// stage is idle for (S−1)(f+b) of it: the bubble (S−1)/(M+S−1) of
// Bubble, exactly, for both schedules and any link capacity.
//
// # Pipeline jobs
//
// A job asks for stages with a parallelism block (JobSpec field 40,
// validated by jobspec, each refusal a FieldError naming the field):
//
//	parallelism:
//	  data: D                       # replicas of the whole pipeline; 0: workers / stages
//	  pipeline:
//	    stages: S                   # default 1 (no pipeline); at most the model's blocks
//	    micro_batches: M            # default S; batch_size (a replica's step batch) splits into M equal parts
//	    schedule: gpipe | 1f1b      # default 1f1b
//	    boundaries: ["layer2.0"]    # the S−1 blocks where stages 1..S−1 start; default: cut by parameter count
//	    debug_stage_cost: fwd=20ms,bwd=40ms   # synthetic cost per micro-batch, for measuring schedules
//
// workers = D × S, mode ring (the default for such jobs). Place gives
// every rank its coordinates from the ring job's assignment alone (rank
// r is stage r mod S of replica r / S), so the coordinator needs no
// pipeline-specific path. On the worker (worker/pipesync.go) each rank
// builds its stage alone (models.NewStage: flat parameter, gradient,
// optimiser and batch-norm buffers of that stage, with the whole model's
// initial values of it) and a stage's Executor runs over peerrpc links
// to its replica's neighbours; the D replicas of a stage all-reduce its
// gradients over a ring of their own and every stage steps its own
// optimiser. No rank holds the whole model: the test split runs through
// replica 0's stages (Executor.Infer) and the last stage's figures reach
// rank 0; the result's checksum is fed stage by stage, each stage's
// parameters broadcast in turn; checkpoints are assembled on rank 0 the
// same way, stage by stage, into one model.safetensors with PyTorch
// names whatever the cut, each stage's tensors written to their offsets
// in the files as they arrive (checkpoint.Writer), so no rank holds
// every stage at once. Every stage rank's progress report carries its stage's
// figures (Progress 180–186: seconds per step, idle fraction, peak
// micro-batches in flight, peak activation bytes), which metrics.jsonl
// records and gradsync watch shows per stage. Not composed with stages
// yet, and refused: ps and
// fedavg modes, grad_accum_steps (micro_batches is the accumulation),
// compression, grad_clip_norm (a norm over all stages), fp16/bf16,
// activation checkpointing, streamed data sets, timed checkpoints and
// nonfinite_policy skip; the balance option of the issue is not there
// (cuts are by parameter count or explicit).
//
// # Lost workers
//
// With D = 1 (or min_workers = workers) a lost stage worker fails the job,
// naming the worker and its rank, stage and replica. A job of D ≥ 2
// replicas with min_workers a multiple of S below workers is elastic: it
// loses whole replicas. The coordinator's core starts a new generation
// on the largest multiple of S workers it has, up to workers
// (coordinator.PlanStages): the survivors, then idle workers, each
// survivor on the stage it held where it can be; survivors that make up
// no whole replica are freed. The ranks agree on a step whose in-memory
// snapshot some survivor holds for every stage (every rank snapshots its
// stage after every step) and each stage's state is broadcast from one
// holder to that stage's ranks (worker/piperecover.go); without one they
// start from the pinned checkpoint, and with neither the generation fails
// once steps were trained. On the same mesh (a spare took the lost
// worker's place) the job's parameters end bit for bit those of an
// undisturbed run; on fewer replicas the global batch is smaller from
// then on, as in an elastic ring job.
package pipeline
