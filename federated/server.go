package federated

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ServerConfig configures the server side of federated rounds. Zero values
// take the documented defaults; Validate reports the rest.
type ServerConfig struct {
	// Clients is K: client IDs are 0..K-1. Required.
	Clients int
	// Fraction is C ∈ [0, 1]: each round samples max(1, round(C·K))
	// clients (SampleClients). 0 means one client per round.
	Fraction float64
	// Rounds is the number of rounds that must close successfully. Required.
	Rounds int
	// MinClients is the fewest answers with which a round may close at its
	// deadline; 0 means 1. It must not exceed the number sampled.
	MinClients int
	// Deadline is how long a round stays open; 0 means 60 s.
	Deadline time.Duration
	// MaxRetries is how many consecutive failed rounds are tolerated: a
	// failed round (fewer than MinClients answers at the deadline, or an
	// aggregation error) discards its updates, leaves the global model
	// unchanged and opens the next round number with a fresh sample;
	// failure number MaxRetries+1 in a row fails the job. 0: the first
	// failed round fails the job.
	MaxRetries int
	// Seed seeds client sampling.
	Seed int64
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.MinClients == 0 {
		c.MinClients = 1
	}
	if c.Deadline == 0 {
		c.Deadline = 60 * time.Second
	}
	return c
}

// Validate reports settings the server cannot run with.
func (c ServerConfig) Validate() error {
	c = c.withDefaults()
	m, err := NumSampled(c.Clients, c.Fraction)
	if err != nil {
		return err
	}
	var errs []error
	if c.Rounds < 1 {
		errs = append(errs, fmt.Errorf("federated: rounds = %d, must be ≥ 1", c.Rounds))
	}
	if c.MinClients < 1 || c.MinClients > m {
		errs = append(errs, fmt.Errorf("federated: min_clients = %d, must be in [1, %d] (the clients sampled per round: max(1, round(%v × %d)))",
			c.MinClients, m, c.Fraction, c.Clients))
	}
	if c.Deadline < 0 {
		errs = append(errs, fmt.Errorf("federated: round deadline %v, must be > 0", c.Deadline))
	}
	if c.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("federated: max retries %d, must be ≥ 0", c.MaxRetries))
	}
	return errors.Join(errs...)
}

// Action is an output of the Server for its shell to carry out, in order:
// *OpenRound, *RoundClosed, *RoundFailed or *Finished.
type Action interface{ action() }

// OpenRound asks the shell to send the global parameters and the round
// number to Clients and to call Tick at Deadline (or soon after).
type OpenRound struct {
	Round    int
	Clients  []int // sampled client IDs, ascending; the shell may keep it
	Deadline time.Time
	// Global is the server's parameter buffer (length P): read it (encode
	// it) before the next call into the Server that can close the round,
	// never write it.
	Global []float32
}

// RoundClosed reports a round that produced new global parameters.
type RoundClosed struct {
	Round        int
	Participants []int // clients whose updates were aggregated, ascending
	Missing      []int // sampled clients that had not answered, ascending
	AtDeadline   bool  // closed by the deadline rather than by the last answer
	Stats        Stats
	Global       []float32 // the new parameters; same ownership as OpenRound.Global
}

// RoundFailed reports a round whose updates were discarded; the global
// model is unchanged. Err is a *TooFewClientsError or the aggregation error.
type RoundFailed struct {
	Round int
	Err   error
	Retry bool // a new round follows; false: the job has failed with Err
}

// Finished reports that Rounds rounds have closed; Global is final.
type Finished struct {
	Global []float32
}

func (*OpenRound) action()   {}
func (*RoundClosed) action() {}
func (*RoundFailed) action() {}
func (*Finished) action()    {}

// TooFewClientsError is a round whose deadline passed with fewer than
// MinClients answers.
// Lost counts the sampled clients whose workers were lost (Drop): with
// them a round can fail before its deadline.
type TooFewClientsError struct {
	Round, Answered, Sampled, Need int
	Lost                           int
}

func (e *TooFewClientsError) Error() string {
	if e.Lost > 0 {
		return fmt.Sprintf("federated: round %d: %d of %d sampled clients answered and %d were lost, need %d",
			e.Round, e.Answered, e.Sampled, e.Lost, e.Need)
	}
	return fmt.Sprintf("federated: round %d: %d of %d sampled clients answered by the deadline, need %d",
		e.Round, e.Answered, e.Sampled, e.Need)
}

// StaleRoundError is an update for a round that has already closed or
// failed (the gRPC layer maps it to codes.Aborted: the client should fetch
// the current round). Late marks a straggler: a client sampled for that
// round that had not answered when it closed.
type StaleRoundError struct {
	Client, Got, Current int
	Late                 bool
}

func (e *StaleRoundError) Error() string {
	kind := "stale"
	if e.Late {
		kind = "late"
	}
	return fmt.Sprintf("federated: %s update from client %d for round %d; the server is at round %d", kind, e.Client, e.Got, e.Current)
}

// UnknownClientError is an update from a client that was not sampled for
// the round (or is not a client at all): codes.InvalidArgument.
type UnknownClientError struct {
	Client, Round int
}

func (e *UnknownClientError) Error() string {
	return fmt.Sprintf("federated: client %d was not sampled for round %d", e.Client, e.Round)
}

// ErrDuplicate is a second update from one client in one round
// (codes.AlreadyExists); ErrNotRunning is a call before Start or after the
// job finished or failed (codes.FailedPrecondition).
var (
	ErrDuplicate  = errors.New("federated: this client has already sent its update for the round")
	ErrNotRunning = errors.New("federated: no round is open")
)

// Counters count refused and failed work since the Server was created.
type Counters struct {
	Stale        int // updates for a closed or failed round (including Late)
	Late         int // stale updates from clients sampled for the round that had not answered
	Rejected     int // updates refused as unknown, duplicate or invalid
	FailedRounds int
}

type serverState int

const (
	stateIdle serverState = iota
	stateOpen
	stateFinished
	stateFailed
)

// Server is the server side of federated rounds as a deterministic state
// machine, in the manner of etcd's raft: inputs (Start, Submit, Tick),
// each stamped with the caller's clock reading, return the Actions the
// shell must carry out; the Server does no I/O, starts no goroutines and
// never reads the clock. The gRPC Federation service and the in-process
// Simulate are shells over it. Not safe for concurrent use: the shell
// serialises calls.
type Server struct {
	cfg      ServerConfig
	strategy *Strategy
	global   []float32

	state     serverState
	round     int // the open (or last) round number; rounds are numbered from 1, a retry takes the next number
	sampled   []int
	deadline  time.Time
	updates   []Update     // this round's accepted updates, in arrival order
	dropped   map[int]bool // sampled clients of the open round that are gone (Drop) and have not answered
	completed int          // rounds closed successfully
	failures  int          // consecutive failed rounds
	err       error        // why the job failed

	lastRound   int          // the last round that closed or failed
	lastMissing map[int]bool // its sampled clients that had not answered

	counters Counters
}

// NewServer returns a Server that owns global (the initial parameters,
// length P) and updates it in place with strategy at each closed round.
func NewServer(cfg ServerConfig, strategy *Strategy, global []float32) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if strategy == nil {
		return nil, errors.New("federated: NewServer: nil strategy")
	}
	return &Server{cfg: cfg.withDefaults(), strategy: strategy, global: global}, nil
}

// Global returns the current global parameters: the server's buffer, to
// read and not to write.
func (s *Server) Global() []float32 { return s.global }

// Round returns the current (open, or last) round number; 0 before Start.
func (s *Server) Round() int { return s.round }

// Completed returns the number of rounds that have closed successfully.
func (s *Server) Completed() int { return s.completed }

// Counters returns the refusal and failure counts.
func (s *Server) Counters() Counters { return s.counters }

// Err returns why the job failed, or nil.
func (s *Server) Err() error { return s.err }

// Resume makes a Server that has not started continue a job that stopped
// (a checkpoint) after completed rounds had closed, the last of them
// numbered round (failed rounds take numbers too, so round ≥ completed).
// The global parameters and the strategy's state are the caller's to
// restore. Start then opens round+1 with the clients an undisturbed run
// samples for it.
func (s *Server) Resume(round, completed int) error {
	switch {
	case s.state != stateIdle:
		return errors.New("federated: Resume: already started")
	case completed < 0 || round < completed:
		return fmt.Errorf("federated: Resume: %d rounds completed by round %d: want 0 ≤ completed ≤ round", completed, round)
	case completed >= s.cfg.Rounds:
		return fmt.Errorf("federated: Resume: %d rounds completed, the job has %d: nothing is left", completed, s.cfg.Rounds)
	}
	s.round, s.completed = round, completed
	return nil
}

// Start opens the first round (1, or the one after Resume's) at now.
func (s *Server) Start(now time.Time) ([]Action, error) {
	if s.state != stateIdle {
		return nil, fmt.Errorf("federated: Start: already started")
	}
	return s.open(nil, now), nil
}

// Submit offers u for its round at now. If now is at or past the open
// round's deadline, the deadline is handled first (as by Tick), so an
// update that arrives late is late however the shell schedules its timer.
// An accepted update's Delta is owned by the Server until its round closes
// or fails (the caller must not write it until then; afterwards it may
// reuse it). Refusals return a typed error and no state change other than
// the counters: *StaleRoundError, *UnknownClientError, ErrDuplicate,
// *InvalidUpdateError, ErrNotRunning. The returned actions are those of the
// deadline handling and, when u is the last sampled client's answer, of
// closing the round. When the round's closing makes the job fail, the
// error is the failure and the actions end with a *RoundFailed.
func (s *Server) Submit(now time.Time, u Update) ([]Action, error) {
	acts, err := s.Tick(now)
	if err != nil {
		return acts, err
	}
	if s.state == stateIdle {
		return acts, ErrNotRunning
	}
	if u.Round < s.round || (u.Round == s.round && s.state != stateOpen) {
		late := u.Round == s.lastRound && s.lastMissing[u.Client]
		if late {
			delete(s.lastMissing, u.Client) // count each straggler once
			s.counters.Late++
		}
		s.counters.Stale++
		return acts, &StaleRoundError{Client: u.Client, Got: u.Round, Current: s.round, Late: late}
	}
	if s.state != stateOpen {
		return acts, ErrNotRunning
	}
	if u.Round > s.round {
		s.counters.Rejected++
		return acts, &InvalidUpdateError{Client: u.Client, Reason: fmt.Sprintf("update for round %d, but the server is at round %d", u.Round, s.round)}
	}
	if _, ok := slices.BinarySearch(s.sampled, u.Client); !ok {
		s.counters.Rejected++
		return acts, &UnknownClientError{Client: u.Client, Round: u.Round}
	}
	for _, v := range s.updates {
		if v.Client == u.Client {
			s.counters.Rejected++
			return acts, ErrDuplicate
		}
	}
	if err := u.check(len(s.global)); err != nil {
		s.counters.Rejected++
		return acts, err
	}
	s.updates = append(s.updates, u)
	delete(s.dropped, u.Client) // it came back in time
	return s.settle(acts, now)
}

// Drop tells the Server at now that client is gone (its worker was lost):
// it will not answer the open round. A round whose sampled clients have
// all answered or gone closes at once rather than at its deadline; with
// fewer than MinClients answers it fails (a *TooFewClientsError counting
// the lost). A dropped client that comes back may still answer while the
// round is open. Dropping a client that is not sampled for the open round,
// or has answered, or when no round is open, changes nothing. Actions and
// error are Submit's.
func (s *Server) Drop(now time.Time, client int) ([]Action, error) {
	acts, err := s.Tick(now)
	if err != nil {
		return acts, err
	}
	if s.state != stateOpen {
		return acts, nil
	}
	if _, ok := slices.BinarySearch(s.sampled, client); !ok || s.answered(client) || s.dropped[client] {
		return acts, nil
	}
	if s.dropped == nil {
		s.dropped = make(map[int]bool)
	}
	s.dropped[client] = true
	return s.settle(acts, now)
}

func (s *Server) answered(client int) bool {
	return slices.ContainsFunc(s.updates, func(u Update) bool { return u.Client == client })
}

// settle closes the open round once every sampled client has answered or
// is gone (Drop), or fails it when too few answered.
func (s *Server) settle(acts []Action, now time.Time) ([]Action, error) {
	if len(s.updates)+len(s.dropped) < len(s.sampled) {
		return acts, nil
	}
	if len(s.updates) < s.cfg.MinClients {
		return s.fail(acts, now, &TooFewClientsError{Round: s.round, Answered: len(s.updates), Sampled: len(s.sampled),
			Need: s.cfg.MinClients, Lost: len(s.dropped)})
	}
	return s.close(acts, now, false)
}

// Tick tells the Server the time is now; at or after the open round's
// deadline it closes the round with the answers in (if at least
// MinClients) or fails it. The error is the job's failure, if this Tick
// caused it.
func (s *Server) Tick(now time.Time) ([]Action, error) {
	if s.state != stateOpen || now.Before(s.deadline) {
		return nil, nil
	}
	return s.expire(nil, now)
}

func (s *Server) expire(acts []Action, now time.Time) ([]Action, error) {
	if len(s.updates) < s.cfg.MinClients {
		return s.fail(acts, now, &TooFewClientsError{Round: s.round, Answered: len(s.updates), Sampled: len(s.sampled),
			Need: s.cfg.MinClients, Lost: len(s.dropped)})
	}
	return s.close(acts, now, true)
}

func (s *Server) close(acts []Action, now time.Time, atDeadline bool) ([]Action, error) {
	st, err := s.strategy.Aggregate(s.global, s.updates)
	if err != nil {
		return s.fail(acts, now, err)
	}
	participants := make([]int, len(s.updates))
	for i, u := range s.updates {
		participants[i] = u.Client
	}
	slices.Sort(participants)
	missing := s.endRound()
	s.completed++
	s.failures = 0
	acts = append(acts, &RoundClosed{Round: s.round, Participants: participants, Missing: missing, AtDeadline: atDeadline, Stats: st, Global: s.global})
	if s.completed == s.cfg.Rounds {
		s.state = stateFinished
		return append(acts, &Finished{Global: s.global}), nil
	}
	return s.open(acts, now), nil
}

func (s *Server) fail(acts []Action, now time.Time, err error) ([]Action, error) {
	s.endRound()
	s.failures++
	s.counters.FailedRounds++
	retry := s.failures <= s.cfg.MaxRetries
	acts = append(acts, &RoundFailed{Round: s.round, Err: err, Retry: retry})
	if !retry {
		s.state = stateFailed
		s.err = err
		return acts, err
	}
	return s.open(acts, now), nil
}

// endRound forgets the round's updates (their deltas return to the
// caller), remembers who was missing, and returns them sorted.
func (s *Server) endRound() []int {
	s.lastRound = s.round
	s.lastMissing = make(map[int]bool)
	var missing []int
	for _, c := range s.sampled {
		if !s.answered(c) {
			s.lastMissing[c] = true
			missing = append(missing, c)
		}
	}
	clear(s.updates) // drop the references to the deltas
	s.updates = s.updates[:0]
	clear(s.dropped)
	return missing
}

func (s *Server) open(acts []Action, now time.Time) []Action {
	s.round++
	sampled, err := SampleClients(s.cfg.Clients, s.cfg.Fraction, s.cfg.Seed, s.round)
	if err != nil {
		panic(err) // Validate checked the arguments
	}
	s.sampled = sampled
	s.deadline = now.Add(s.cfg.Deadline)
	s.state = stateOpen
	return append(acts, &OpenRound{Round: s.round, Clients: slices.Clone(sampled), Deadline: s.deadline, Global: s.global})
}
