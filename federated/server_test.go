package federated

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newTestServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	s, err := NewServer(cfg, mustStrategy(t, StrategyConfig{}), []float32{0, 0})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func upd(client, round int, d float32) Update {
	return Update{Client: client, Round: round, Delta: []float32{d, -d}, NumExamples: 1}
}

func only[T Action](t *testing.T, acts []Action) []T {
	t.Helper()
	var out []T
	for _, a := range acts {
		if x, ok := a.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

func start(t *testing.T, s *Server) *OpenRound {
	t.Helper()
	acts, err := s.Start(t0)
	if err != nil || len(acts) != 1 {
		t.Fatalf("Start: %v, %v", acts, err)
	}
	return acts[0].(*OpenRound)
}

func TestServerClosesWhenAllAnswer(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 4, Fraction: 0.5, Rounds: 2, Seed: 1})
	open := start(t, s)
	if open.Round != 1 || len(open.Clients) != 2 || !open.Deadline.Equal(t0.Add(60*time.Second)) {
		t.Fatalf("open %+v", open)
	}
	a, b := open.Clients[0], open.Clients[1]
	if acts, err := s.Submit(t0.Add(time.Second), upd(a, 1, 1)); err != nil || len(acts) != 0 {
		t.Fatalf("first answer: %v, %v", acts, err)
	}
	acts, err := s.Submit(t0.Add(2*time.Second), upd(b, 1, 3))
	if err != nil {
		t.Fatal(err)
	}
	closed, next := only[*RoundClosed](t, acts), only[*OpenRound](t, acts)
	if len(closed) != 1 || len(next) != 1 || closed[0].AtDeadline || len(closed[0].Missing) != 0 {
		t.Fatalf("actions %v", acts)
	}
	if !slices.Equal(s.Global(), []float32{2, -2}) || next[0].Round != 2 || !next[0].Deadline.Equal(t0.Add(62*time.Second)) {
		t.Fatalf("global %v, next %+v", s.Global(), next[0])
	}
	for _, c := range next[0].Clients {
		acts, err = s.Submit(t0.Add(3*time.Second), upd(c, 2, 1))
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(only[*Finished](t, acts)) != 1 || s.Completed() != 2 {
		t.Fatalf("after the last round: %v", acts)
	}
	if _, err := s.Submit(t0.Add(4*time.Second), upd(0, 3, 1)); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("after finishing: %v, want ErrNotRunning", err)
	}
}

// A client that never answers: the round closes at its deadline with the
// others, and its update afterwards is late.
func TestServerDeadlineClosesWithoutSilentClient(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 5, Fraction: 0.6, Rounds: 3, MinClients: 2, Deadline: 10 * time.Second, Seed: 2})
	open := start(t, s)
	silent := open.Clients[2]
	for _, c := range open.Clients[:2] {
		if _, err := s.Submit(t0.Add(time.Second), upd(c, 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if acts, _ := s.Tick(t0.Add(9 * time.Second)); len(acts) != 0 {
		t.Fatalf("before the deadline: %v", acts)
	}
	acts, err := s.Tick(t0.Add(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	closed := only[*RoundClosed](t, acts)
	if len(closed) != 1 || !closed[0].AtDeadline || !slices.Equal(closed[0].Missing, []int{silent}) ||
		!slices.Equal(closed[0].Participants, open.Clients[:2]) || len(only[*OpenRound](t, acts)) != 1 {
		t.Fatalf("at the deadline: %v %+v", acts, closed)
	}
	var stale *StaleRoundError
	if _, err := s.Submit(t0.Add(11*time.Second), upd(silent, 1, 1)); !errors.As(err, &stale) || !stale.Late || stale.Current != 2 {
		t.Fatalf("straggler: %v, want a late *StaleRoundError", err)
	}
	if _, err := s.Submit(t0.Add(11*time.Second), upd(open.Clients[0], 1, 1)); !errors.As(err, &stale) || stale.Late {
		t.Fatalf("resend of an aggregated update: %v, want stale, not late", err)
	}
	if c := s.Counters(); c.Stale != 2 || c.Late != 1 {
		t.Fatalf("counters %+v, want 2 stale, 1 late", c)
	}
}

// An update that arrives after the deadline, before the shell's timer
// fires, is late: Submit handles the deadline first.
func TestServerSubmitAfterDeadlineIsLate(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 2, Fraction: 1, Rounds: 2, MinClients: 1, Deadline: 10 * time.Second})
	start(t, s)
	if _, err := s.Submit(t0.Add(time.Second), upd(0, 1, 1)); err != nil {
		t.Fatal(err)
	}
	acts, err := s.Submit(t0.Add(10*time.Second), upd(1, 1, 1))
	var stale *StaleRoundError
	if !errors.As(err, &stale) || !stale.Late || len(only[*RoundClosed](t, acts)) != 1 || len(only[*OpenRound](t, acts)) != 1 {
		t.Fatalf("%v, %v: want the round closed at its deadline and a late update", acts, err)
	}
	if !slices.Equal(s.Global(), []float32{1, -1}) {
		t.Fatalf("global %v: the late delta must not count", s.Global())
	}
}

func TestServerTooFewClients(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 4, Fraction: 1, Rounds: 1, MinClients: 3, Deadline: time.Second, MaxRetries: 1})
	open := start(t, s)
	if _, err := s.Submit(t0, upd(open.Clients[0], 1, 1)); err != nil {
		t.Fatal(err)
	}
	acts, err := s.Tick(t0.Add(time.Second))
	if err != nil {
		t.Fatalf("first failure with one retry left: %v", err)
	}
	failed := only[*RoundFailed](t, acts)
	var few *TooFewClientsError
	if len(failed) != 1 || !failed[0].Retry || !errors.As(failed[0].Err, &few) || few.Answered != 1 || few.Need != 3 {
		t.Fatalf("actions %v", acts)
	}
	if next := only[*OpenRound](t, acts); len(next) != 1 || next[0].Round != 2 {
		t.Fatalf("retry: %v", acts)
	}
	if !slices.Equal(s.Global(), []float32{0, 0}) {
		t.Fatalf("a failed round changed global to %v", s.Global())
	}
	acts, err = s.Tick(t0.Add(2 * time.Second))
	if !errors.As(err, &few) || few.Answered != 0 || s.Err() == nil {
		t.Fatalf("second failure: %v, want *TooFewClientsError", err)
	}
	if f := only[*RoundFailed](t, acts); len(f) != 1 || f[0].Retry {
		t.Fatalf("actions %v", acts)
	}
	if c := s.Counters(); c.FailedRounds != 2 {
		t.Fatalf("counters %+v", c)
	}
}

func TestServerRefusals(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 10, Fraction: 0.3, Rounds: 5, Seed: 3})
	if _, err := s.Submit(t0, upd(0, 1, 1)); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("before Start: %v", err)
	}
	open := start(t, s)
	notSampled := 0
	for slices.Contains(open.Clients, notSampled) {
		notSampled++
	}
	var unknown *UnknownClientError
	if _, err := s.Submit(t0, upd(notSampled, 1, 1)); !errors.As(err, &unknown) {
		t.Errorf("unsampled client: %v", err)
	}
	if _, err := s.Submit(t0, upd(99, 1, 1)); !errors.As(err, &unknown) {
		t.Errorf("no such client: %v", err)
	}
	var inv *InvalidUpdateError
	c := open.Clients[0]
	if _, err := s.Submit(t0, upd(c, 2, 1)); !errors.As(err, &inv) {
		t.Errorf("future round: %v", err)
	}
	if _, err := s.Submit(t0, Update{Client: c, Round: 1, Delta: []float32{1}, NumExamples: 1}); !errors.As(err, &inv) {
		t.Errorf("wrong length: %v", err)
	}
	var stale *StaleRoundError
	if _, err := s.Submit(t0, upd(c, 0, 1)); !errors.As(err, &stale) {
		t.Errorf("old round: %v", err)
	}
	if _, err := s.Submit(t0, upd(c, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(t0, upd(c, 1, 1)); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate: %v", err)
	}
	if got := s.Counters(); got.Rejected != 5 || got.Stale != 1 {
		t.Errorf("counters %+v, want 5 rejected, 1 stale", got)
	}
	if _, err := s.Start(t0); err == nil {
		t.Error("second Start accepted")
	}
}

// A round whose answers hold no examples fails like a round with too few
// answers.
func TestServerAggregationErrorFailsRound(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 1, Fraction: 1, Rounds: 1, MaxRetries: 1})
	start(t, s)
	acts, err := s.Submit(t0, Update{Client: 0, Round: 1, Delta: []float32{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if f := only[*RoundFailed](t, acts); len(f) != 1 || !errors.Is(f[0].Err, ErrNoExamples) || !f[0].Retry {
		t.Fatalf("actions %v", acts)
	}
}

func TestServerConfigValidate(t *testing.T) {
	for name, cfg := range map[string]ServerConfig{
		"no clients":        {Rounds: 1},
		"no rounds":         {Clients: 3, Fraction: 1},
		"min above sampled": {Clients: 10, Fraction: 0.2, Rounds: 1, MinClients: 3},
		"bad fraction":      {Clients: 10, Fraction: 2, Rounds: 1},
		"negative retries":  {Clients: 10, Rounds: 1, MaxRetries: -1},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := (ServerConfig{Clients: 10, Rounds: 1}).Validate(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
}

// A sampled client whose worker is lost (Drop) does not hold the round
// until its deadline: it closes as soon as the others have answered,
// whichever comes first, with the lost client missing.
func TestServerDropClosesEarly(t *testing.T) {
	for _, dropFirst := range []bool{true, false} {
		s := newTestServer(t, ServerConfig{Clients: 3, Fraction: 1, Rounds: 2, Seed: 1})
		open := start(t, s)
		a, b, gone := open.Clients[0], open.Clients[1], open.Clients[2]
		var acts []Action
		var err error
		if dropFirst {
			if acts, err = s.Drop(t0.Add(time.Second), gone); err != nil || len(acts) != 0 {
				t.Fatalf("drop with nobody in: %v, %v", acts, err)
			}
		}
		for i, c := range []int{a, b} {
			if acts, err = s.Submit(t0.Add(time.Duration(2+i)*time.Second), upd(c, 1, 1)); err != nil {
				t.Fatal(err)
			}
		}
		if !dropFirst {
			if len(acts) != 0 {
				t.Fatalf("closed before the lost client was dropped: %v", acts)
			}
			if acts, err = s.Drop(t0.Add(4*time.Second), gone); err != nil {
				t.Fatal(err)
			}
		}
		closed := only[*RoundClosed](t, acts)
		if len(closed) != 1 || closed[0].AtDeadline || !slices.Equal(closed[0].Missing, []int{gone}) ||
			!slices.Equal(closed[0].Participants, []int{a, b}) {
			t.Fatalf("dropFirst=%v: actions %v", dropFirst, acts)
		}
		next := only[*OpenRound](t, acts)
		if len(next) != 1 || next[0].Round != 2 {
			t.Fatalf("dropFirst=%v: next round %v", dropFirst, acts)
		}
		// The drop belonged to round 1: in round 2 every client counts again.
		for _, c := range []int{a, b} {
			if acts, err = s.Submit(t0.Add(5*time.Second), upd(c, 2, 1)); err != nil || len(acts) != 0 {
				t.Fatalf("round 2 closed without client %d: %v, %v", gone, acts, err)
			}
		}
	}
}

// A dropped client that comes back within the round is still taken; a
// drop of a client that is not sampled, or has answered, changes nothing.
func TestServerDropComeBackAndNoOps(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 4, Fraction: 0.5, Rounds: 1, Seed: 1})
	open := start(t, s)
	a, b := open.Clients[0], open.Clients[1]
	other := slices.IndexFunc([]int{0, 1, 2, 3}, func(c int) bool { return c != a && c != b })
	if acts, err := s.Drop(t0, other); err != nil || len(acts) != 0 {
		t.Fatalf("drop of an unsampled client: %v, %v", acts, err)
	}
	if acts, err := s.Submit(t0.Add(time.Second), upd(a, 1, 1)); err != nil || len(acts) != 0 {
		t.Fatal(acts, err)
	}
	if acts, err := s.Drop(t0.Add(time.Second), a); err != nil || len(acts) != 0 {
		t.Fatalf("drop of a client that answered: %v, %v", acts, err)
	}
	if acts, err := s.Drop(t0.Add(2*time.Second), b); err != nil || len(only[*RoundClosed](t, acts)) != 1 {
		t.Fatalf("drop of the last one: %v, %v", acts, err)
	}
	// Second server: b drops, then answers after all.
	s = newTestServer(t, ServerConfig{Clients: 4, Fraction: 0.5, Rounds: 1, Seed: 1})
	start(t, s)
	if acts, err := s.Drop(t0, b); err != nil || len(acts) != 0 {
		t.Fatal(acts, err)
	}
	if acts, err := s.Submit(t0.Add(time.Second), upd(b, 1, 1)); err != nil || len(acts) != 0 {
		t.Fatalf("the dropped client's answer: %v, %v", acts, err)
	}
	acts, err := s.Submit(t0.Add(2*time.Second), upd(a, 1, 1))
	closed := only[*RoundClosed](t, acts)
	if err != nil || len(closed) != 1 || len(closed[0].Missing) != 0 || len(closed[0].Participants) != 2 {
		t.Fatalf("after the come-back: %v, %v", acts, err)
	}
}

// With fewer than MinClients left to answer the round fails at once,
// saying how many were lost, rather than at its deadline.
func TestServerDropFailsWithTooFew(t *testing.T) {
	s := newTestServer(t, ServerConfig{Clients: 2, Fraction: 1, Rounds: 1, MinClients: 2, Seed: 1})
	open := start(t, s)
	if acts, err := s.Submit(t0.Add(time.Second), upd(open.Clients[0], 1, 1)); err != nil || len(acts) != 0 {
		t.Fatal(acts, err)
	}
	acts, err := s.Drop(t0.Add(2*time.Second), open.Clients[1])
	var few *TooFewClientsError
	if !errors.As(err, &few) || few.Lost != 1 || few.Answered != 1 || len(only[*RoundFailed](t, acts)) != 1 {
		t.Fatalf("drop below min_clients: %v, %v", acts, err)
	}
	if want := "1 of 2 sampled clients answered and 1 were lost, need 2"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q, want it to say %q", err, want)
	}
}
