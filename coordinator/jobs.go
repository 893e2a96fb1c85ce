package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The core's job table: each job's lifecycle (PENDING → RUNNING → a
// final state), its generation and members, which ranks finished or
// failed, and, once it ended, which tasks it still waits for. The shell
// keeps the job's record for clients (the pb.Job), its event buffers,
// store and run log, and follows the actions below.

// Job is the core's record of one job.
type Job struct {
	ID    string
	Mode  string
	State pb.JobState
	// Generation counts the job's starts (1 at its first, one more per
	// recovery or growth); Members are its workers by rank.
	Generation uint64
	Members    []string
	// Placed holds the workers a job was placed on while the shell
	// prepares it (Prepared ends that).
	Placed []string
	// done and results are by rank of the current generation; failed
	// holds the workers whose task of it ended with an error.
	done    []bool
	results []*pb.JobResult
	failed  map[string]bool
	// tasked: assignments were sent (a job that fails while starting
	// has no task to cancel).
	tasked bool
	// Once a running job has ended: stopping holds the workers told to
	// stop its generation stopGen that have not yet said their task
	// stopped (or been lost).
	stopping map[string]bool
	stopGen  uint64
	// stragglers applies the straggler rule to the current generation.
	stragglers *Stragglers
	// rec is the job's elastic-recovery state; size and min its number
	// of workers and the least it runs on; steps the latest step each
	// rank of the generation reported; resumeFrom the checkpoint its
	// generation falls back to; minIdle how long a ring link must be idle
	// to count as broken; realClients: a fedavg job with real clients.
	rec         Recovery
	size, min   int
	steps       []int64
	resumeFrom  string
	minIdle     float64
	realClients bool
	// stages: the pipeline stages of its mesh (≤ 1: none).
	stages int
	// labelShards, tensor: the label shards or tensor-parallel ranks of
	// each replica of its mesh (≤ 1: none).
	labelShards, tensor int
	// memory is what each rank needs of its worker's memory (rank r:
	// memory[r mod len]; nil: nothing stated), for new generations.
	memory []Need
	// entrypoint: the job runs a user's command, so its new generations
	// go only to workers that run commands.
	entrypoint bool
}

// Stopping lists the workers whose task of the ended job has not yet
// stopped.
func (j *Job) Stopping() []string {
	var ids []string
	for id := range j.stopping {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// AnyRankDone reports whether a rank of the current generation finished
// its task.
func (j *Job) AnyRankDone() bool { return slices.Contains(j.done, true) }

// Prepared: what a placed job needs (run directory, initial model,
// parameter server or round driver) was made. RunDirErr says its run
// directory could not be made (the job fails without running); Failure
// that the rest could not (it fails once running, so its run log says
// why).
type Prepared struct {
	At                 time.Time
	Job                string
	RunDirErr, Failure string
}

// TaskDone: Worker's task of rank Rank of generation Generation of Job
// ended, with Error ("" it finished, with Result). Links is a ring
// rank's frame counts when it failed. CommandFailed: an entrypoint
// rank's own command failed while its ring was whole (the cause of the
// failure, not a victim of another rank's).
type TaskDone struct {
	At            time.Time
	Worker, Job   string
	Generation    uint64
	Rank          int
	Error         string
	Result        *pb.JobResult
	Links         *pb.RingLinks
	CommandFailed bool
}

// Cancel: a user cancels Job (Reason optional).
type Cancel struct {
	At          time.Time
	Job, Reason string
}

// End: the shell ends Job in State with Message (a lost worker it does
// not recover from, a parameter server or round driver that failed or
// finished, a failure deadline that passed); Result, when set, is the
// job's result.
type End struct {
	At      time.Time
	Job     string
	State   pb.JobState
	Message string
	Result  *pb.JobResult
}

// Loaded: a job that ended before the server started (from the store).
type Loaded struct {
	At    time.Time
	Job   string
	State pb.JobState
}

func (i Prepared) when() time.Time { return i.At }
func (i TaskDone) when() time.Time { return i.At }
func (i Cancel) when() time.Time   { return i.At }
func (i End) when() time.Time      { return i.At }
func (i Loaded) when() time.Time   { return i.At }

// SetState: Job is now in State, for Message (store it, log it,
// announce it). A job that starts running does so on Workers, by rank,
// as generation 1.
type SetState struct {
	Job     string
	State   pb.JobState
	Message string
	Workers []string
}

// EndJob: Job ended in State for Message, with Result when set: store
// and announce it, stop its parameter server or round driver (and, but
// for success, checkpoint it). Running says it was running: CancelTasks
// and then TasksStopped follow.
type EndJob struct {
	Job     string
	State   pb.JobState
	Message string
	Result  *pb.JobResult
	Running bool
}

// DropPrepared: a job was prepared after it ended, or while the server
// stops: what was made for it is dropped (Ended: it ended; its run is
// finished).
type DropPrepared struct {
	Job   string
	Ended bool
}

// StartGeneration: Job's generation Generation runs on Workers, by rank
// (the shell resets its per-rank record); Assigns follow.
type StartGeneration struct {
	Job        string
	Generation uint64
	Workers    []string
	// ResumeFrom is the checkpoint the generation falls back to.
	ResumeFrom string
}

// Assign: give Worker rank Rank of Job's generation Generation, on a
// ring of Peers (every rank's address).
type Assign struct {
	Job        string
	Generation uint64
	Worker     string
	Rank       int
	Peers      []string
	// ResumeFrom is the checkpoint to fall back to ("" none); Trained
	// the most steps the job is known to have trained.
	ResumeFrom string
	Trained    int64
}

// CancelTask: tell Worker to stop its task of Job, for Reason; KeepState
// asks it to keep its in-memory snapshot (a recovery).
type CancelTask struct {
	Job, Worker, Reason string
	KeepState           bool
}

// TasksStopped: every task of the ended Job has stopped (or will say so
// no more): a cancel may return, a resume may read its checkpoints.
type TasksStopped struct{ Job string }

func (SetState) action()        {}
func (EndJob) action()          {}
func (DropPrepared) action()    {}
func (StartGeneration) action() {}
func (Assign) action()          {}
func (CancelTask) action()      {}
func (TasksStopped) action()    {}

// ErrUnknownJob refuses an input naming a job the core never had.
var ErrUnknownJob = errors.New("coordinator: unknown job")

// EndedError refuses to cancel a job that already ended.
type EndedError struct {
	Job   string
	State pb.JobState
}

func (e *EndedError) Error() string { return fmt.Sprintf("job %s already ended (%v)", e.Job, e.State) }

// RankError refuses a report of a running job's rank from a worker that
// does not hold it.
type RankError struct {
	Worker, Job string
	Rank        int
}

func (e *RankError) Error() string {
	return fmt.Sprintf("worker %s reported on rank %d of job %s, which it does not hold", e.Worker, e.Rank, e.Job)
}

// Job returns a copy of job id's record.
func (c *Core) Job(id string) (Job, bool) {
	j := c.jobs[id]
	if j == nil {
		return Job{}, false
	}
	return *j, true
}

// stepJob applies the inputs of the job table (ok false: in is not one).
func (c *Core) stepJob(out []Action, in Input) (_ []Action, ok bool, err error) {
	switch in := in.(type) {
	case Loaded:
		if c.jobs[in.Job] == nil {
			c.jobs[in.Job] = &Job{ID: in.Job, State: in.State}
		}
	case Prepared:
		out = c.prepared(out, in)
	case Progress:
		out = c.progress(out, in)
	case TaskDone:
		out, err = c.taskDone(out, in)
	case Cancel:
		j := c.jobs[in.Job]
		switch {
		case j == nil:
			return nil, true, ErrUnknownJob
		case Final(j.State):
			return nil, true, &EndedError{Job: j.ID, State: j.State}
		}
		msg := "cancelled by user"
		if in.Reason != "" {
			msg += ": " + in.Reason
		}
		out = c.end(out, j, pb.JobState_JOB_STATE_CANCELLED, msg, nil)
	case End:
		if j := c.jobs[in.Job]; j != nil {
			out = c.end(out, j, in.State, in.Message, in.Result)
		}
	case Pinned:
		out = c.pinned(out, in)
	case Started:
		out, err = c.started(out, in)
	default:
		return out, false, nil
	}
	return out, true, err
}

// prepared runs a placed job once the shell made what it needs.
func (c *Core) prepared(out []Action, in Prepared) []Action {
	j := c.jobs[in.Job]
	if j == nil {
		return out
	}
	placed := j.Placed
	j.Placed = nil
	switch {
	case Final(j.State) || c.closed:
		// Cancelled meanwhile (its workers were freed then), or the
		// server stops (the job stays PENDING in the store).
		return append(out, DropPrepared{Job: j.ID, Ended: Final(j.State)})
	case in.RunDirErr != "":
		j.State = pb.JobState_JOB_STATE_FAILED
		out = append(out, SetState{Job: j.ID, State: j.State, Message: "creating run directory: " + in.RunDirErr})
		c.release(j.ID, placed)
		return out
	}
	j.State, j.Generation, j.Members = pb.JobState_JOB_STATE_RUNNING, 1, placed
	out = append(out, SetState{Job: j.ID, State: j.State, Message: fmt.Sprintf("running on %d worker(s)", len(placed)), Workers: slices.Clone(placed)})
	if in.Failure != "" {
		return c.end(out, j, pb.JobState_JOB_STATE_FAILED, in.Failure, nil)
	}
	return c.startGeneration(out, j, 1, placed)
}

// startGeneration gives generation gen of j to workers, by rank.
func (c *Core) startGeneration(out []Action, j *Job, gen uint64, workers []string) []Action {
	workers = slices.Clone(workers)
	j.Generation, j.Members = gen, workers
	j.done, j.results, j.failed = make([]bool, len(workers)), make([]*pb.JobResult, len(workers)), nil
	j.steps = make([]int64, len(workers))
	peers := make([]string, len(workers))
	for r, id := range workers {
		if w := c.workers[id]; w != nil {
			peers[r] = w.Address
			if w.State != pb.WorkerState_WORKER_STATE_LOST {
				w.State, w.Job = pb.WorkerState_WORKER_STATE_BUSY, j.ID
			}
		}
	}
	j.tasked = true
	out = append(out, StartGeneration{Job: j.ID, Generation: gen, Workers: slices.Clone(workers), ResumeFrom: j.resumeFrom})
	for r, id := range workers {
		out = append(out, Assign{Job: j.ID, Generation: gen, Worker: id, Rank: r, Peers: slices.Clone(peers), ResumeFrom: j.resumeFrom, Trained: j.rec.Trained()})
	}
	return out
}

// taskDone takes the end of one task.
func (c *Core) taskDone(out []Action, in TaskDone) ([]Action, error) {
	j := c.jobs[in.Job]
	switch {
	case j == nil:
		return out, nil
	case Final(j.State):
		if in.Generation == j.stopGen {
			out = c.taskStopped(out, j, in.Worker)
		}
		return out, nil
	case c.closed || in.Generation != j.Generation || j.State != pb.JobState_JOB_STATE_RUNNING:
		// The job stays RUNNING in the store (the next start decides),
		// or the task is of a generation left behind (told to stop).
		return out, nil
	case in.Rank < 0 || in.Rank >= len(j.Members) || j.Members[in.Rank] != in.Worker:
		return out, &RankError{Worker: in.Worker, Job: j.ID, Rank: in.Rank}
	}
	if in.Error != "" {
		if j.failed == nil {
			j.failed = map[string]bool{}
		}
		j.failed[in.Worker] = true // its task is over: nothing to stop
		msg := fmt.Sprintf("rank %d (worker %s): %s", in.Rank, in.Worker, in.Error)
		if j.Mode == "ring" {
			return c.rankFailed(out, j, in, msg), nil
		}
		return c.end(out, j, pb.JobState_JOB_STATE_FAILED, msg, nil), nil
	}
	j.done[in.Rank], j.results[in.Rank] = true, in.Result
	if slices.Contains(j.done, false) {
		c.release(j.ID, []string{in.Worker}) // free for the next job; the job goes on
		return out, nil
	}
	// Every rank finished: the result is rank 0's, with the ranks'
	// throughput summed.
	res := j.results[0]
	if res == nil {
		res = &pb.JobResult{}
	}
	var ips float64
	for _, r := range j.results {
		ips += r.GetImagesPerSecond()
	}
	res.ImagesPerSecond = ips
	unit := "epoch(s)"
	if j.Mode == "fedavg" {
		unit = "round(s)"
	}
	return c.end(out, j, pb.JobState_JOB_STATE_SUCCEEDED, fmt.Sprintf("test accuracy %.2f%% after %d %s", 100*res.TestAccuracy, res.Epochs, unit), res), nil
}

// end finishes a running or pending job: its state, the cancellation
// of its tasks, its workers freed (or it leaves the queue).
func (c *Core) end(out []Action, j *Job, st pb.JobState, msg string, res *pb.JobResult) []Action {
	if Final(j.State) {
		return out
	}
	wasRunning := j.State == pb.JobState_JOB_STATE_RUNNING
	j.State = st
	out = append(out, EndJob{Job: j.ID, State: st, Message: msg, Result: res, Running: wasRunning})
	switch {
	case wasRunning:
		j.stopping, j.stopGen = map[string]bool{}, j.Generation
		for r, id := range j.Members {
			w := c.workers[id]
			if w == nil || w.Job != j.ID || !j.tasked || (r < len(j.done) && j.done[r]) {
				continue // gone, moved on, never given its task, or done with it
			}
			if st != pb.JobState_JOB_STATE_SUCCEEDED && w.State != pb.WorkerState_WORKER_STATE_LOST && !j.failed[id] {
				j.stopping[id] = true
			}
			out = append(out, CancelTask{Job: j.ID, Worker: id, Reason: msg})
		}
		if len(j.stopping) == 0 {
			out = append(out, TasksStopped{Job: j.ID})
		}
		c.release(j.ID, j.Members)
	case j.Placed != nil: // placed, still being prepared
		c.release(j.ID, j.Placed)
	default:
		c.queue = slices.DeleteFunc(c.queue, func(p Pending) bool { return p.Job == j.ID })
	}
	return out
}

// taskStopped notes that worker id's task of the ended job j stopped.
func (c *Core) taskStopped(out []Action, j *Job, id string) []Action {
	if !j.stopping[id] {
		return out
	}
	delete(j.stopping, id)
	if len(j.stopping) == 0 {
		out = append(out, TasksStopped{Job: j.ID})
	}
	return out
}

// release frees job's tasks on workers: each worker still holding the
// job is idle again.
func (c *Core) release(job string, workers []string) {
	for _, id := range workers {
		if w := c.workers[id]; w != nil && w.Job == job {
			w.Job = ""
			if w.State == pb.WorkerState_WORKER_STATE_BUSY {
				w.State = pb.WorkerState_WORKER_STATE_IDLE
			}
		}
	}
}

// sortedJobs is the job table by id (a fixed order for actions).
func (c *Core) sortedJobs() []*Job {
	js := make([]*Job, 0, len(c.jobs))
	for _, j := range c.jobs {
		js = append(js, j)
	}
	slices.SortFunc(js, func(a, b *Job) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return js
}
