package coordinator

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Core is the coordinator's state machine for who runs what: the worker
// registry (each worker's address, resources, state, job, and when it
// connected and was last heard from), the FIFO queue of pending jobs,
// liveness (a worker silent for longer than the heartbeat timeout is
// lost) and the gang scheduler's placements.
//
// It is driven the way etcd's raft is: the shell feeds it Inputs, each
// stamped with the time it happened, through Step, and carries out the
// Actions it returns, in order. It keeps no clock and does no I/O; a
// Core is not safe for concurrent use (the shell serialises Steps under
// its lock). The zero value is not usable: make one with NewCore.
type Core struct {
	timeout time.Duration
	workers map[string]*Worker
	queue   []Pending
	jobs    map[string]*Job
	closed  bool
}

// NewCore returns a core whose workers are lost after heartbeatTimeout
// of silence (checked on each Tick).
func NewCore(heartbeatTimeout time.Duration) *Core {
	return &Core{timeout: heartbeatTimeout, workers: map[string]*Worker{}, jobs: map[string]*Job{}}
}

// Worker is the registry's record of one worker.
type Worker struct {
	ID, Name, Address string
	// Resources are what the worker reported in its hello (shared, read
	// only).
	Resources *pb.Resources
	// Memory is the memory it offers to a task, in bytes (0: not
	// reported).
	Memory uint64
	State  pb.WorkerState
	// Job is the job whose task the worker holds ("" when none).
	Job string
	// Connected is when its current connection said hello, Seen when it
	// was last heard from.
	Connected, Seen time.Time
}

// An Input is something that happened, stamped with when.
type Input interface{ when() time.Time }

// Hello: a worker connected (or reconnected after it was lost).
type Hello struct {
	At           time.Time
	Worker, Name string
	Address      string
	Resources    *pb.Resources
	Memory       uint64 // the memory it offers, bytes (0: not reported)
}

// Heard: a message (heartbeat, progress, anything) arrived from a worker.
type Heard struct {
	At     time.Time
	Worker string
}

// Disconnected: a worker's stream ended, for Reason.
type Disconnected struct {
	At             time.Time
	Worker, Reason string
}

// Tick: time passed; silent workers are declared lost.
type Tick struct{ At time.Time }

// Submit: a job was submitted (or is queued again at a restart) and
// needs Workers workers at once.
type Submit struct {
	At      time.Time
	Job     string
	Workers int
	// Mode is the job's mode (ring, ps, fedavg, ...); a ring job with
	// MinWorkers < Workers is elastic. RealClients: a fedavg job whose
	// clients are the workers. StepTimeoutSeconds is the job's step
	// timeout; ResumeFrom the checkpoint it starts from ("" none).
	Mode               string
	MinWorkers         int
	RealClients        bool
	StepTimeoutSeconds float64
	ResumeFrom         string
	// Entrypoint: only workers that run commands may take it.
	Entrypoint bool
	// Stages is the job's pipeline stages (0 or 1: no pipeline): its
	// ranks sit on the mesh pipeline.Place gives, and a lost rank is
	// named by its stage and replica too.
	Stages int
	// LabelShards is the job's label shards L (0 or 1: none): rank r is
	// label shard r mod L of replica r / L, and a lost rank is named so.
	LabelShards int
	// Tensor is the job's tensor-parallel ranks T (0 or 1: none): rank r
	// is tensor rank r mod T of replica r / T, and a lost rank is named so.
	Tensor int
	// Memory is what each rank needs of its worker's memory (see
	// Pending.Memory); nil: nothing stated.
	Memory []Need
}

// Shutdown: the server is stopping; nothing is placed any more.
type Shutdown struct{ At time.Time }

func (i Hello) when() time.Time        { return i.At }
func (i Heard) when() time.Time        { return i.At }
func (i Disconnected) when() time.Time { return i.At }
func (i Tick) when() time.Time         { return i.At }
func (i Submit) when() time.Time       { return i.At }
func (i Shutdown) when() time.Time     { return i.At }

// An Action is what the shell must do, in the order given.
type Action interface{ action() }

// Welcome: answer Worker's hello.
type Welcome struct{ Worker string }

// Disconnect: close Worker's stream (it was declared lost).
type Disconnect struct{ Worker string }

// WorkerLost: Worker (at Address) is lost for Reason, silent for Silent
// before it was declared so; Job is the job it held ("" none), which
// the shell fails or recovers. Timeout says its heartbeats stopped.
type WorkerLost struct {
	Worker, Address, Job, Reason string
	Silent                       time.Duration
	Timeout                      bool
}

// Place: start Job on Workers, by rank (they are now BUSY with it, and
// it has left the queue).
type Place struct {
	Job     string
	Workers []string
}

func (Welcome) action()    {}
func (Disconnect) action() {}
func (WorkerLost) action() {}
func (Place) action()      {}

// ConnectedError refuses a hello from a worker id that is connected.
type ConnectedError struct{ Worker, Address string }

func (e *ConnectedError) Error() string {
	return fmt.Sprintf("worker id %q is already connected from %s", e.Worker, e.Address)
}

// Step applies one input and returns the actions it calls for. An input
// the core refuses (a hello from a worker id already connected) returns
// an error and changes nothing. Inputs naming a worker or job the core
// does not know are ignored: they are late (the worker reconnected, the
// job ended).
func (c *Core) Step(in Input) ([]Action, error) {
	out, ok, err := c.stepJob(nil, in)
	if err != nil {
		return nil, err
	}
	if ok {
		out = c.schedule(out)
		switch in.(type) {
		case Progress, Started: // no worker was freed
		default:
			// Idle workers may have appeared: elastic jobs below their
			// size grow onto what the queue leaves.
			out = c.grow(out)
		}
		return out, nil
	}
	grow := true
	switch in := in.(type) {
	case Hello:
		if old := c.workers[in.Worker]; old != nil && old.State != pb.WorkerState_WORKER_STATE_LOST {
			return nil, &ConnectedError{Worker: in.Worker, Address: old.Address}
		}
		c.workers[in.Worker] = &Worker{ID: in.Worker, Name: in.Name, Address: in.Address, Resources: in.Resources, Memory: in.Memory,
			State: pb.WorkerState_WORKER_STATE_IDLE, Connected: in.At, Seen: in.At}
		out = append(out, Welcome{Worker: in.Worker})
	case Heard:
		grow = false
		if w := c.workers[in.Worker]; w != nil && w.State != pb.WorkerState_WORKER_STATE_LOST {
			w.Seen = in.At
		}
	case Disconnected:
		if w := c.workers[in.Worker]; w != nil {
			out = c.lose(out, w, in.At, in.Reason, false)
		}
	case Tick:
		for _, w := range c.sorted() {
			if w.State != pb.WorkerState_WORKER_STATE_LOST && in.At.Sub(w.Seen) > c.timeout {
				out = c.lose(out, w, in.At, fmt.Sprintf("no heartbeat for %.1fs (timeout %v)", in.At.Sub(w.Seen).Seconds(), c.timeout), true)
			}
		}
		out = c.due(out, in.At)
		grow = len(out) > 0
	case Submit:
		if c.jobs[in.Job] == nil || Final(c.jobs[in.Job].State) {
			c.jobs[in.Job] = &Job{ID: in.Job, Mode: in.Mode, State: pb.JobState_JOB_STATE_PENDING, size: in.Workers, min: in.MinWorkers,
				realClients: in.RealClients, minIdle: in.StepTimeoutSeconds / 2, resumeFrom: in.ResumeFrom, stages: in.Stages,
				labelShards: in.LabelShards, tensor: in.Tensor}
		}
		c.jobs[in.Job].memory, c.jobs[in.Job].entrypoint = in.Memory, in.Entrypoint
		if !slices.ContainsFunc(c.queue, func(p Pending) bool { return p.Job == in.Job }) {
			c.queue = append(c.queue, Pending{Job: in.Job, Workers: in.Workers, Entrypoint: in.Entrypoint, Memory: in.Memory})
		}
	case Shutdown:
		c.closed = true
		for _, j := range c.sortedJobs() { // no task reports any more
			if len(j.stopping) > 0 {
				clear(j.stopping)
				out = append(out, TasksStopped{Job: j.ID})
			}
		}
	default:
		panic(fmt.Sprintf("coordinator: unknown input %T", in))
	}
	out = c.schedule(out)
	if grow {
		out = c.grow(out)
	}
	return out, nil
}

// lose declares w lost at now.
func (c *Core) lose(out []Action, w *Worker, now time.Time, reason string, timeout bool) []Action {
	if w.State == pb.WorkerState_WORKER_STATE_LOST {
		return out
	}
	job := w.Job
	w.State, w.Job = pb.WorkerState_WORKER_STATE_LOST, ""
	out = append(out, Disconnect{Worker: w.ID})
	for _, j := range c.sortedJobs() { // an ended job waits no more for its task
		out = c.taskStopped(out, j, w.ID)
	}
	out = append(out,
		WorkerLost{Worker: w.ID, Address: w.Address, Job: job, Reason: reason, Silent: now.Sub(w.Seen), Timeout: timeout})
	if j := c.jobs[job]; j != nil {
		out = c.workerLost(out, j, w, reason, now.Sub(w.Seen))
	}
	return out
}

// schedule places every queued job the FIFO gang scheduler can start,
// and fails the job at the queue's head when the connected workers could
// never hold it (a rank's memory need that no worker left meets), so
// that it does not block the queue for ever.
func (c *Core) schedule(out []Action) []Action {
	if c.closed {
		return out
	}
	runsCommands := func(id string) bool { return c.workers[id].Resources.GetAllowsEntrypoints() }
	memory := func(id string) uint64 { return c.workers[id].Memory }
	out = c.place(out, runsCommands, memory)
	for len(c.queue) > 0 {
		head := c.queue[0]
		why := Unplaceable(head, c.connected(), runsCommands, memory)
		j := c.jobs[head.Job]
		if why == "" || j == nil {
			break
		}
		out = c.end(out, j, pb.JobState_JOB_STATE_FAILED, why, nil)
		c.queue = slices.DeleteFunc(c.queue, func(p Pending) bool { return p.Job == head.Job })
		out = c.place(out, runsCommands, memory)
	}
	return out
}

// connected lists the workers not lost, in the order idle ones are
// picked.
func (c *Core) connected() []string {
	var ids []string
	for _, w := range c.sorted() {
		if w.State != pb.WorkerState_WORKER_STATE_LOST {
			ids = append(ids, w.ID)
		}
	}
	return ids
}

// place starts every queued job the FIFO gang scheduler can start now.
func (c *Core) place(out []Action, runsCommands func(string) bool, memory func(string) uint64) []Action {
	for _, p := range Schedule(c.queue, c.Idle(), runsCommands, memory) {
		c.queue = c.queue[1:]
		for _, id := range p.Workers {
			w := c.workers[id]
			w.State, w.Job = pb.WorkerState_WORKER_STATE_BUSY, p.Job
		}
		if j := c.jobs[p.Job]; j != nil {
			j.Placed = p.Workers
		}
		out = append(out, Place(p))
	}
	return out
}

// sorted is every worker in the order idle workers are picked: by
// connection time, then id.
func (c *Core) sorted() []*Worker {
	ws := make([]*Worker, 0, len(c.workers))
	for _, w := range c.workers {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *Worker) int {
		if n := a.Connected.Compare(b.Connected); n != 0 {
			return n
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return ws
}

// Idle lists the idle workers in the order they are picked: by
// connection time, then id.
func (c *Core) Idle() []string {
	var ids []string
	for _, w := range c.sorted() {
		if w.State == pb.WorkerState_WORKER_STATE_IDLE {
			ids = append(ids, w.ID)
		}
	}
	return ids
}

// Worker returns a copy of worker id's record.
func (c *Core) Worker(id string) (Worker, bool) {
	w := c.workers[id]
	if w == nil {
		return Worker{}, false
	}
	return *w, true
}

// Workers returns a copy of every worker's record, by id.
func (c *Core) Workers() []Worker {
	out := make([]Worker, 0, len(c.workers))
	for _, w := range c.workers {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b Worker) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Queued lists the pending jobs in the order they start.
func (c *Core) Queued() []Pending { return slices.Clone(c.queue) }
