package coordinator

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Phase is where a job's recovery stands.
type Phase int

const (
	// Steady: nothing is being recovered.
	Steady Phase = iota
	// Pinning: a recovery (or growth) is decided and waits for the shell
	// to pin the checkpoint its new generation falls back to (disk work
	// done outside the server's lock); Pinned then plans it again with
	// the workers there are by then.
	Pinning
	// Rejoining: a new generation was assigned after a lost worker (or
	// to grow the job) and has not yet said where its state comes from
	// (TaskStarted) or reported progress.
	Rejoining
	// Failing: a ring rank reported a broken step. A broken ring is
	// usually a lost peer, which the coordinator sees a moment later
	// and recovers from (or names); if nothing of the kind happens by
	// the deadline the job fails with the rank's own error.
	Failing
)

func (p Phase) String() string {
	switch p {
	case Steady:
		return "steady"
	case Pinning:
		return "pinning"
	case Rejoining:
		return "rejoining"
	case Failing:
		return "failing"
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// Recovery is the elastic-recovery state of one job: which phase it is
// in, what it needs to report when the phase ends, the most steps the
// job is known to have trained, and the workers cut off from its ring.
// The zero value is a steady job.
type Recovery struct {
	// trained is the most steps the job is known to have trained
	// (progress, and where generations started), told to new
	// generations so that one that finds no state fails instead of
	// starting over.
	trained int64
	// evicted workers were cut off from this job's ring and are not
	// taken back into it.
	evicted map[string]bool
	pin     *Pin
	rejoin  *rejoin
	fail    *failing
	links   RingLinks
}

// rejoin is a recovery (or growth) in progress.
type rejoin struct {
	lost     string // "" for growth
	at       time.Time
	lastStep int64
	from     string
	fromStep int64
	// silent is how long the lost worker had been silent when it was
	// declared lost (since its last message).
	silent float64
}

// Pin is a recovery waiting for its checkpoint pin.
type Pin struct {
	// Gen is the generation being recovered from: a pin that comes back
	// after the job moved on is dropped.
	Gen uint64
	// Lost is the worker lost ("" for growth), Address where it was,
	// Reason why, and Silent how long it had been silent.
	Lost, Address, Reason string
	Silent                time.Duration
	// FailMsg is what the job fails with if the recovery cannot go on
	// ("" for growth, which is then just not done).
	FailMsg string
}

// failing is a rank's failure waiting for its deadline.
type failing struct {
	at      time.Time
	msg     string
	gen     uint64
	reports int // the ranks' reports in msg
}

// Phase reports where the recovery stands; a failure deadline during
// a rejoin counts as Failing.
func (r *Recovery) Phase() Phase {
	switch {
	case r.fail != nil:
		return Failing
	case r.pin != nil:
		return Pinning
	case r.rejoin != nil:
		return Rejoining
	}
	return Steady
}

// Rejoining reports whether a new generation has yet to start (even
// while a failure also waits for its deadline).
func (r *Recovery) Rejoining() bool { return r.rejoin != nil }

// AwaitPin enters the Pinning phase with p; a recovery already waiting
// keeps its own (it plans without every worker lost meanwhile).
func (r *Recovery) AwaitPin(p Pin) {
	if r.pin == nil {
		r.pin = &p
	}
}

// Pinning reports whether a recovery waits for its checkpoint pin.
func (r *Recovery) Pinning() bool { return r.pin != nil }

// Pinned ends the Pinning phase, returning the recovery that waited.
func (r *Recovery) Pinned() (Pin, bool) {
	if r.pin == nil {
		return Pin{}, false
	}
	p := *r.pin
	r.pin = nil
	return p, true
}

// Trained is the most steps the job is known to have trained.
func (r *Recovery) Trained() int64 { return r.trained }

// NoteTrained records that the job has trained step steps.
func (r *Recovery) NoteTrained(step int64) { r.trained = max(r.trained, step) }

// Evict records that worker id was cut off from the job's ring: it is
// never taken back into the job.
func (r *Recovery) Evict(id string) {
	if r.evicted == nil {
		r.evicted = map[string]bool{}
	}
	r.evicted[id] = true
}

// Evicted reports whether worker id was cut off from the job's ring.
func (r *Recovery) Evicted(id string) bool { return r.evicted[id] }

// RingFailed adds a ring rank's failure report (its frame counts) from
// generation gen of world ranks; once the reports name the rank cut off
// it returns that rank and the evidence.
func (r *Recovery) RingFailed(gen uint64, world, rank int, links *pb.RingLinks, minIdle float64) (culprit int, why string, ok bool) {
	return r.links.Report(gen, world, rank, links, minIdle)
}

// RankFailed starts the Failing phase: the job fails at now+wait with
// msg unless a recovery to a generation after gen begins first. A
// failure already waiting keeps its deadline; the reports of other ranks
// of its generation are added to its message (up to maxReports in all),
// so that the rank whose own error broke the ring is named even when its
// neighbour's "peer gone" arrived first.
func (r *Recovery) RankFailed(now time.Time, gen uint64, msg string, wait time.Duration) {
	switch {
	case r.fail == nil:
		r.fail = &failing{at: now.Add(wait), msg: msg, gen: gen, reports: 1}
	case r.fail.gen == gen && r.fail.reports < maxReports && !strings.Contains(r.fail.msg, msg):
		r.fail.msg += "; also " + msg
		r.fail.reports++
	}
}

// maxReports is how many ranks' reports a failure's message gathers.
const maxReports = 3

// Due reports, for a job now at generation gen, whether a waiting
// failure's deadline has passed, and the message to fail with.
func (r *Recovery) Due(now time.Time, gen uint64) (msg string, ok bool) {
	if r.fail == nil || !now.After(r.fail.at) {
		return "", false
	}
	msg = r.fail.msg
	if gen != r.fail.gen {
		msg += " (no recovery)"
	}
	return msg, true
}

// Plan picks the workers of a recovery's (or growth's) new generation:
// the survivors, then idle workers in the order given (never an
// evicted one) up to size. It refuses fewer than min workers, and for
// growth a generation no larger than the current one.
func (r *Recovery) Plan(survivors, idle []string, size, min int, grow bool) ([]string, bool) {
	ids := append([]string(nil), survivors...)
	for _, id := range idle {
		if len(ids) >= size {
			break
		}
		if !r.evicted[id] && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) < min || (grow && len(ids) == len(survivors)) {
		return nil, false
	}
	return ids, true
}

// Begin enters the Rejoining phase at now: generation gen's ranks start
// after the loss of worker lost (silent for that long before it was
// declared so; "" for growth) from lastStep, with checkpoint from as the
// fallback state. It ends a waiting failure: a recovery is what it was
// waiting for.
func (r *Recovery) Begin(now time.Time, lost string, silent time.Duration, lastStep int64, from string) {
	r.trained = max(r.trained, lastStep)
	r.fail = nil
	var fromStep int64
	fmt.Sscanf(filepath.Base(from), "ckpt-%d", &fromStep)
	r.rejoin = &rejoin{lost: lost, at: now, lastStep: lastStep, from: from, fromStep: fromStep, silent: silent.Seconds()}
}

// Outcome is how a phase ended: the job event to announce and the
// record for the run's metrics.jsonl.
type Outcome struct {
	Message string
	Record  map[string]any
	Seconds float64
}

// Started takes a generation's TaskStarted (rank 0: where its state came
// from) at now, for a job on workers workers. It ends a rejoin, and then
// says what to announce.
func (r *Recovery) Started(now time.Time, st *pb.TaskStarted, workers int) (Outcome, bool) {
	r.trained = max(r.trained, st.Step)
	rc := r.rejoin
	if rc == nil {
		return Outcome{}, false
	}
	r.rejoin = nil
	from := StartedFrom(st)
	took := now.Sub(rc.at).Seconds()
	redone := max(max(rc.lastStep, st.NewestStep)-st.Step, 0)
	msg := fmt.Sprintf("recovered from the loss of %s in %.1fs (silent %.1fs before it was declared lost): generation %d on %d worker(s) starts from %s; %d step(s) redone",
		rc.lost, took, rc.silent, st.Generation, workers, from, redone)
	if rc.lost == "" {
		msg = fmt.Sprintf("grew to %d workers in %.1fs: generation %d starts from %s; %d step(s) redone",
			workers, took, st.Generation, from, redone)
	}
	rec := map[string]any{"kind": "recovered", "time": stamp(now), "lost_worker": rc.lost,
		"detect_seconds": rc.silent, "recovery_seconds": took, "agree_seconds": st.AgreeSeconds,
		"generation": st.Generation, "workers": workers, "last_step_before": max(rc.lastStep, st.NewestStep),
		"source": st.Source, "source_rank": st.SourceRank, "checkpoint": st.Checkpoint, "start_step": st.Step, "steps_redone": redone}
	return Outcome{Message: msg, Record: rec, Seconds: took}, true
}

// Progressed takes generation gen's first progress report at now (of
// step step), for workers that did not say where their state came from
// (an entrypoint's command resumes from what it saved itself): it ends a
// rejoin, and then says what to announce.
func (r *Recovery) Progressed(now time.Time, gen uint64, workers int, step int64) (Outcome, bool) {
	rc := r.rejoin
	if rc == nil {
		return Outcome{}, false
	}
	r.rejoin = nil
	took := now.Sub(rc.at).Seconds()
	redone := max(rc.lastStep-rc.fromStep, 0)
	what := fmt.Sprintf("training again from step %d (about %d steps redone)", rc.fromStep, redone)
	if rc.fromStep == 0 && step > 1 {
		// No checkpoint, yet not from scratch: from a state of its own
		// (an entrypoint's command loads what it saved).
		what = fmt.Sprintf("training again: its first report is of step %d (the last before the loss: %d)", step, rc.lastStep)
		redone = max(rc.lastStep-step+1, 0)
	}
	msg := fmt.Sprintf("recovered from the loss of %s in %.1fs: generation %d %s", rc.lost, took, gen, what)
	if rc.lost == "" {
		msg = fmt.Sprintf("grew to %d workers in %.1fs: generation %d %s", workers, took, gen, what)
	}
	rec := map[string]any{"kind": "recovered", "time": stamp(now), "lost_worker": rc.lost,
		"recovery_seconds": took, "generation": gen, "last_step_before": rc.lastStep, "checkpoint": rc.from,
		"steps_redone": redone, "first_step_reported": step}
	return Outcome{Message: msg, Record: rec, Seconds: took}, true
}

// StartedFrom says in words where a generation's state came from.
func StartedFrom(st *pb.TaskStarted) string {
	switch st.Source {
	case "memory":
		return fmt.Sprintf("the in-memory snapshot of rank %d at step %d", st.SourceRank, st.Step)
	case "checkpoint":
		return fmt.Sprintf("checkpoint %s (step %d)", st.Checkpoint, st.Step)
	}
	return "scratch"
}

// stamp is the time format of metrics.jsonl records.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
