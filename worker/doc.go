// Package worker is a gradsync worker process: it connects to the
// coordinator (reconnecting with backoff), reports its resources (and
// the memory it offers, with --memory-limit), serves its
// peer Collective endpoint, and runs the training task it is assigned for
// its rank, reporting progress, evaluations and the result.
//
// A ps or ring task is a Trainer stepping through a synchronizer (the
// contract is in sync.go); a fedavg task is the federated simulation or a
// real federated client. The files, by what they serve:
//
//	worker.go           the process: config, coordinator session, reports
//	task.go             an assignment: data, objective, which mode runs it
//	objective.go        what a step computes: loss, batches, evaluation
//	accum.go            forward and backward, with gradient accumulation
//	checkpoint.go       writing and reading checkpoints (ring, fedavg)
//
//	trainer.go          Trainer: resume, epochs, steps, reports, result
//	trainerplan.go      the steps and positions from where training starts (pure)
//	trainerstats.go     per-step timing for progress reports
//	sync.go             the synchronizer contract; joining one
//
//	ring*.go            ring mode: ringsync.go the all-reduce and the
//	                    optimiser, ringtask.go the synchronizer (start,
//	                    snapshots, checkpoints, statistics), and elastic
//	                    recovery: ringagree.go (which state a generation
//	                    starts from), ringsnapshot.go (in-memory
//	                    snapshots), ringckpt.go (compression state in
//	                    checkpoints)
//	ps*.go              ps mode: psclient.go the streams to the shards,
//	                    pscompress.go one step's pushes and pulls,
//	                    pssync.go the synchronizer
//	pipe*.go            pipeline stages: pipesync.go the synchronizer
//	                    (each rank builds its stage alone; its executor,
//	                    links, replica ring; the checksum fed stage by
//	                    stage), pipeeval.go evaluation through the
//	                    stages, pipeckpt.go checkpoints assembled stage
//	                    by stage, pipestats.go each stage's summary,
//	                    pipemem.go the memory a worker offers
//	                    (--memory-limit)
//	tp*.go              model-parallel jobs of package tensorpar:
//	                    tplabel.go label-sharded heads (the body
//	                    replicated over a replica's shards, the head's
//	                    classes split; why, and the checkpoints and
//	                    checksum gathered from the shards),
//	                    tptensor.go tensor-parallel mlp (fc1 and fc2 a
//	                    Megatron pair) and vit-tiny (each transformer
//	                    block split by heads and MLP units; the patch
//	                    embedding, norms and head replicated),
//	                    tpmesh.go what both share
//	                    (the rings of a replica's group and of a
//	                    rank's replicas, the step), tpstats.go what
//	                    each rank's group sent, beside the formulas
//	fed*.go             fedavg: fedsim.go all clients simulated here,
//	                    fedclient.go this worker as one real client
//	entry*.go           entrypoint jobs: entry.go the ring, the agent
//	                    socket (package agent, with the job's
//	                    compression per gradient bucket) and the
//	                    reports of a user's command, entryproc.go its
//	                    process (process group, log, SIGTERM then
//	                    SIGKILL; on Linux it dies with the worker)
package worker
