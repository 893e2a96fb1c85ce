package federation

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Coordinator is what a Driver asks of the coordinator that runs its job.
// The Driver calls it only from Run's goroutine, one call at a time, in
// the order it decided them, and never while holding its own lock: an
// implementation may take the coordinator's lock, and may call the
// Driver's methods under it.
type Coordinator interface {
	// Emit announces an event of the job (see Event).
	Emit(Event)
	// Log appends rec (it holds "kind" and "time") to the job's run log,
	// metrics.jsonl.
	Log(rec map[string]any)
	// End ends the job in state (SUCCEEDED or FAILED) with msg; result,
	// when not nil, is the job's result. The coordinator then aborts the
	// driver. A job that already ended stays as it is.
	End(state pb.JobState, msg string, result *pb.JobResult)
}

// Event is one job event the driver asks the coordinator to announce.
type Event struct {
	Kind pb.EventKind
	// Message is a LOG event's line.
	Message string
	// Progress, for a PROGRESS event, is the job's progress now.
	Progress *pb.Progress
	// Eval, for an EVAL event, is an evaluation of the global model, to
	// record as every evaluation is (metrics.jsonl, charts, the event).
	Eval *pb.TaskEval
}

// Config describes the running job a Driver serves.
type Config struct {
	JobID      string
	Generation uint64
	Spec       *pb.JobSpec
	// WorkerIDs are the job's workers by rank: client k is WorkerIDs[k].
	WorkerIDs []string
	// Net is the model: its layout, its initial parameters and the
	// buffers checkpoints hold. A resume loads the checkpoint into it.
	// Nil for an entrypoint job (its clients are scripts): the layout and
	// the initial parameters come from the clients' joins (entry.go), and
	// there are no checkpoints.
	Net *models.Network
	// ResumeFrom is the checkpoint the job resumes from; "" starts afresh.
	ResumeFrom string
	// CheckpointDir is where checkpoints go; "" writes none.
	CheckpointDir string
	// Started is when the job started running (for progress' elapsed
	// time and ETA).
	Started time.Time
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives the driver's logs. Default slog.Default().
	Logger *slog.Logger
}

// fedOutbox bounds the messages queued for one client; a client that lets
// this many pile up is not reading and is dropped (it misses its rounds).
const fedOutbox = 32

// maxLabelClasses bounds label histograms from the network.
const maxLabelClasses = 256

// Driver is the round driver of one running fedavg job with real clients.
type Driver struct {
	coord    Coordinator
	now      func() time.Time
	log      *slog.Logger
	jobID    string
	gen      uint64
	spec     *pb.JobSpec
	n        int // clients: one per worker
	workers  []string
	params   int // model parameters
	classes  int
	rounds   int
	every    int // evaluate every this many closed rounds
	deadline time.Duration
	started  time.Time           // the job's start
	net      *models.Network     // the model's layout, and the buffers its checkpoints hold; nil for an entrypoint job
	strat    *federated.Strategy // the server optimiser, whose state checkpoints hold
	ckpt     *checkpointer       // nil: the job writes no checkpoints
	// entry: the clients are scripts (an entrypoint job); the round state
	// machine is made when the first round opens (srvCfg), from the
	// initial parameters of a client's join (entry.go).
	entry  bool
	srvCfg federated.ServerConfig
	// firstDone is the number of rounds closed before this run (those of
	// the checkpoint it resumed from); resumedDone says they are all of
	// them, so only the final evaluation is left.
	firstDone   int
	resumedDone bool

	wake chan struct{} // (capacity 1) wakeAt changed, or calls are queued: Run has work
	done chan struct{} // closed by Abort
	// receivers counts the streams' receive loops; Run waits for them.
	// Add only under mu while not stopped, so that no Add follows Wait.
	receivers sync.WaitGroup

	// mu guards everything below. It is never held while calling coord.
	mu      sync.Mutex
	stopped bool                // Abort was called
	ended   bool                // the driver asked coord to end the job
	doneMsg string              // when it ended the job SUCCEEDED: the clients' FederationDone
	calls   []func(Coordinator) // for coord, in order; Run makes them
	srv     *federated.Server   // nil until the first round opens in an entrypoint job
	begun   bool                // the rounds have started
	// An entrypoint job's model, from its clients' joins (entry.go):
	// layout is the first join's (params is set with it); initial and
	// initialFrom are the initial parameters of the lowest-index client
	// that joined before the rounds began, which the global model starts
	// from (nil once they have).
	layout      []*pb.TensorInfo
	initial     []float32
	initialFrom int
	startBy     time.Time      // the first round opens then at the latest
	sessions    []*session     // by client; nil while not connected
	hists       [][]int        // by client: its label histogram (from its join)
	weights     [][]float32    // by client: class-balanced loss weights; nil without reweighting
	lost        []bool         // by client: its worker is lost
	nLost       int            // clients lost
	open        *openRound     // the open round, nil when none
	closed      int            // rounds closed, those before a resume included
	lastRound   int            // the number of the last round that closed
	evals       []*pendingEval // closed rounds waiting for their evaluation, oldest first
	evaluator   *session       // who evaluates; nil: pick one when needed
	finished    bool           // the last round closed: the job ends with its evaluation
	evalBy      time.Time      // when finished: the final evaluation is due by then
	wakeAt      time.Time      // when Run must call tick; zero: never
	last        *pb.TaskEval   // the latest evaluation recorded
	lastTrain   float64        // the last closed round's training loss
}

// openRound is an open round as clients are told of it.
type openRound struct {
	round    int
	sampled  []int
	deadline time.Time
	model    []float32 // the global parameters the round starts from; read only
}

// pendingEval is a closed round waiting for the evaluator.
type pendingEval struct {
	info   *pb.RoundInfo
	train  float64   // the round's training loss
	model  []float32 // the global parameters after it; read only
	sentTo *session
}

// New builds the round driver of cfg's job from cfg.Net's initial
// parameters, or, when the job resumes, from its checkpoint's (Net is
// loaded with them). Nothing runs until Run is called; coord hears of
// nothing before.
func New(cfg Config, coord Coordinator) (*Driver, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	spec, net := cfg.Spec, cfg.Net
	entry := net == nil
	switch {
	case entry && !jobspec.IsEntrypoint(spec):
		return nil, errors.New("federation: no model for a job that is not an entrypoint job")
	case entry && (cfg.ResumeFrom != "" || cfg.CheckpointDir != ""):
		return nil, errors.New("federation: checkpoints of entrypoint jobs are not implemented yet")
	}
	f := spec.GetFederated()
	weighting, err := federated.ParseWeighting(f.GetWeighting())
	if err != nil {
		return nil, err
	}
	strat, err := federated.NewStrategy(federated.StrategyConfig{Name: f.GetStrategy(), Weighting: weighting,
		ServerLR: f.GetServerLr(), ServerMomentum: f.GetServerMomentum()})
	if err != nil {
		return nil, err
	}
	n := len(cfg.WorkerIDs)
	rounds := int(f.GetRounds())
	var snap *federated.Snapshot
	if cfg.ResumeFrom != "" {
		if snap, err = federated.LoadCheckpoint(cfg.ResumeFrom, jobspec.CheckpointHash(spec)); err != nil {
			return nil, fmt.Errorf("resuming from checkpoint: %w", err)
		}
		if snap.Completed > rounds {
			return nil, fmt.Errorf("resuming from checkpoint %s: %d rounds closed, the job has %d", cfg.ResumeFrom, snap.Completed, rounds)
		}
		if err := snap.Restore(net, strat); err != nil {
			return nil, fmt.Errorf("resuming from checkpoint %s: %w", cfg.ResumeFrom, err)
		}
	}
	deadline := time.Duration(f.GetRoundDeadlineSeconds() * float64(time.Second))
	srvCfg := federated.ServerConfig{Clients: n, Fraction: f.GetFraction(), Rounds: rounds,
		MinClients: int(f.GetMinClients()), Deadline: deadline, Seed: spec.GetSeed()}
	var srv *federated.Server
	params := 0
	if entry {
		err = srvCfg.Validate() // the Server itself is made when the first round opens
	} else {
		params = net.NumParams()
		srv, err = federated.NewServer(srvCfg, strat, slices.Clone(net.Params()))
	}
	if err != nil {
		return nil, err
	}
	firstDone, lastRound := 0, 0
	if snap != nil {
		firstDone, lastRound = snap.Completed, snap.Round
		if snap.Completed < rounds {
			if err := srv.Resume(snap.Round, snap.Completed); err != nil {
				return nil, fmt.Errorf("resuming from checkpoint %s: %w", cfg.ResumeFrom, err)
			}
		}
	}
	_, _, _, classes := jobspec.InputShape(spec)
	now := cfg.Now()
	d := &Driver{
		coord: coord, now: cfg.Now, log: cfg.Logger,
		jobID: cfg.JobID, gen: cfg.Generation, spec: spec, n: n, workers: slices.Clone(cfg.WorkerIDs),
		params: params, classes: classes, entry: entry, srvCfg: srvCfg, rounds: rounds, every: max(int(f.GetEvalEveryRounds()), 1),
		deadline: deadline, started: cfg.Started, net: net, strat: strat, firstDone: firstDone, resumedDone: firstDone == rounds,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
		srv: srv, startBy: now.Add(deadline), sessions: make([]*session, n),
		hists: make([][]int, n), weights: make([][]float32, n), lost: make([]bool, n),
		closed: firstDone, lastRound: lastRound,
	}
	if cfg.CheckpointDir != "" {
		d.ckpt = &checkpointer{dir: cfg.CheckpointDir, keep: int(spec.GetCheckpoint().GetKeep()),
			meta:     checkpoint.Meta{JobID: cfg.JobID, SpecHash: jobspec.CheckpointHash(spec), WorldSize: n, Seed: spec.GetSeed()},
			model:    jobspec.ModelMetadata(spec, nil, nil),
			lastSave: now, saved: firstDone}
	}
	if entry {
		// Scripts take a while to start (torch, their data).
		d.startBy = now.Add(jobspec.FedJoinWait(spec))
	}
	d.wakeAt = d.startBy
	return d, nil
}

// Run keeps the driver's time (the start's, the rounds' and the final
// evaluation's deadlines) and makes its Coordinator calls, until the
// driver is aborted; it then waits for the receive loops of its streams
// (which end with their handlers) and returns.
func (d *Driver) Run() {
	defer d.receivers.Wait()
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	arm := func() {
		d.mu.Lock()
		at := d.wakeAt
		now := d.now()
		d.mu.Unlock()
		t.Stop()
		if !at.IsZero() {
			t.Reset(max(at.Sub(now), 0))
		}
	}
	arm()
	for {
		d.flush()
		select {
		case <-d.done:
			return
		case <-d.wake:
			arm()
		case <-t.C:
			d.tick()
			arm()
		}
	}
}

// flush makes the queued Coordinator calls, in order, outside the lock.
// Those left when the driver is aborted are dropped: the job has ended,
// or the server is stopping and keeps it as it is.
func (d *Driver) flush() {
	d.mu.Lock()
	calls := d.calls
	d.calls = nil
	d.mu.Unlock()
	for _, call := range calls {
		select {
		case <-d.done:
			return
		default:
		}
		call(d.coord)
	}
}

// Abort stops the driver: Run returns and every client's stream ends
// (with FederationDone when the driver itself ended the job SUCCEEDED).
// Safe to call more than once, and under the coordinator's lock.
func (d *Driver) Abort(error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		d.stopped = true
		close(d.done)
	}
}

// WorkerLost tells the driver that a worker of the job is lost: its
// client misses the rounds it is sampled for; the job fails only when
// every client is lost. Safe under the coordinator's lock.
func (d *Driver) WorkerLost(workerID, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k := slices.Index(d.workers, workerID); k >= 0 && d.activeLocked() {
		d.clientLostLocked(k, workerID, reason)
	}
	d.kickLocked()
}

// SaveStopped writes the checkpoint of a job that stops early (after
// Abort): the state after its last closed round, so that a resume loses
// nothing. It writes nothing ("", nil) for a job without checkpoints or
// that closed no round since it started. Safe under the coordinator's
// lock (it writes the files under the driver's).
func (d *Driver) SaveStopped(now time.Time) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ckpt == nil {
		return "", nil
	}
	return d.saveLocked(now)
}

// callLocked queues a Coordinator call for Run.
func (d *Driver) callLocked(call func(Coordinator)) {
	d.calls = append(d.calls, call)
	d.kickLocked()
}

// kickLocked tells Run that it has work: wakeAt changed, or calls are
// queued.
func (d *Driver) kickLocked() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// activeLocked reports whether the driver still runs the job.
func (d *Driver) activeLocked() bool {
	return !d.stopped && !d.ended
}

func (d *Driver) emitLocked(ev Event) {
	d.callLocked(func(c Coordinator) { c.Emit(ev) })
}

// logLocked stamps rec with the time and queues it for the run log.
func (d *Driver) logLocked(rec map[string]any) {
	rec["time"] = d.now().UTC().Format(time.RFC3339Nano)
	d.callLocked(func(c Coordinator) { c.Log(rec) })
}

// endLocked asks the coordinator to end the job; the driver does nothing
// more for it from now on.
func (d *Driver) endLocked(state pb.JobState, msg string, result *pb.JobResult) {
	d.ended = true
	d.callLocked(func(c Coordinator) { c.End(state, msg, result) })
}

func (d *Driver) failLocked(msg string) {
	d.endLocked(pb.JobState_JOB_STATE_FAILED, msg, nil)
}
