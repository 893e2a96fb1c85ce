// Package trace records a rank's timeline — forward and backward per
// layer, each gradient bucket's readiness and all-reduce, the optimiser
// step — and writes it in Chrome's trace-event format (the JSON object
// form: {"traceEvents": [...]}) that chrome://tracing and Perfetto open.
//
// A Recorder is safe for concurrent use: the training goroutine and the
// reducer's goroutine record into it at once, each under its own thread
// id. It holds at most a fixed number of events (the rest are counted as
// dropped and said so in the file), so a long job cannot grow it without
// bound. Times are passed in by the caller; the package reads no clock.
package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// Thread ids of the timelines a rank records.
const (
	TidCompute = 1 // the training goroutine: forward, backward, optimiser
	TidComm    = 2 // the reducer: bucket all-reduces
)

// Categories of events; Overlap compares two of them.
const (
	CatForward  = "forward"
	CatBackward = "backward"
	CatComm     = "comm"
	CatOptim    = "optim"
	CatStep     = "step"
)

// DefaultMaxEvents bounds a Recorder made with max ≤ 0.
const DefaultMaxEvents = 1 << 20

// Event is one trace event: a complete event ("X", with Dur) or an
// instant ("i").
type Event struct {
	Name  string
	Cat   string
	Phase byte // 'X' or 'i'
	Tid   int
	Start time.Time
	Dur   time.Duration
	Args  map[string]any
}

// Recorder collects events.
type Recorder struct {
	origin time.Time
	max    int

	mu      sync.Mutex // protects events and dropped
	events  []Event
	dropped int
}

// New returns a Recorder whose timestamps count from origin, holding at
// most max events (DefaultMaxEvents when max ≤ 0).
func New(origin time.Time, max int) *Recorder {
	if max <= 0 {
		max = DefaultMaxEvents
	}
	return &Recorder{origin: origin, max: max}
}

// Add records e (a nil Recorder records nothing).
func (r *Recorder) Add(e Event) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) >= r.max {
		r.dropped++
		return
	}
	r.events = append(r.events, e)
}

// Span records a complete event from start to end.
func (r *Recorder) Span(name, cat string, tid int, start, end time.Time, args map[string]any) {
	r.Add(Event{Name: name, Cat: cat, Phase: 'X', Tid: tid, Start: start, Dur: end.Sub(start), Args: args})
}

// Instant records an instant event at t.
func (r *Recorder) Instant(name, cat string, tid int, t time.Time, args map[string]any) {
	r.Add(Event{Name: name, Cat: cat, Phase: 'i', Tid: tid, Start: t, Args: args})
}

// Events returns a copy of the events recorded so far and how many were
// dropped past the bound.
func (r *Recorder) Events() ([]Event, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events), r.dropped
}

// Overlap returns the seconds the complete events of category a spend
// with some event of category b running (the union of b's intervals),
// and the total seconds of a's events: the share of, say, all-reduce
// time hidden under backward is overlap/total.
func Overlap(events []Event, a, b string) (overlap, total float64) {
	var bs [][2]time.Time
	for _, e := range events {
		if e.Phase == 'X' && e.Cat == b && e.Dur > 0 {
			bs = append(bs, [2]time.Time{e.Start, e.Start.Add(e.Dur)})
		}
	}
	bs = union(bs)
	for _, e := range events {
		if e.Phase != 'X' || e.Cat != a || e.Dur <= 0 {
			continue
		}
		s, end := e.Start, e.Start.Add(e.Dur)
		total += e.Dur.Seconds()
		// bs is sorted and disjoint: sum the intersections.
		i := sort.Search(len(bs), func(i int) bool { return bs[i][1].After(s) })
		for ; i < len(bs) && bs[i][0].Before(end); i++ {
			lo, hi := maxTime(s, bs[i][0]), minTime(end, bs[i][1])
			if hi.After(lo) {
				overlap += hi.Sub(lo).Seconds()
			}
		}
	}
	return overlap, total
}

// union merges intervals into sorted, disjoint ones.
func union(iv [][2]time.Time) [][2]time.Time {
	slices.SortFunc(iv, func(x, y [2]time.Time) int { return x[0].Compare(y[0]) })
	var out [][2]time.Time
	for _, v := range iv {
		if n := len(out); n > 0 && !v[0].After(out[n-1][1]) {
			out[n-1][1] = maxTime(out[n-1][1], v[1])
			continue
		}
		out = append(out, v)
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// chromeEvent is one entry of traceEvents, with Chrome's field names;
// ts and dur are microseconds.
type chromeEvent struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	Ts    float64        `json:"ts"`
	Dur   *float64       `json:"dur,omitempty"`
	Pid   int            `json:"pid"`
	Tid   int            `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// WriteChrome writes the events as a Chrome trace of process pid (the
// rank) named name, with threads named for their timelines and meta
// (string values) in otherData, the events dropped past the bound
// included.
func (r *Recorder) WriteChrome(w io.Writer, pid int, name string, meta map[string]string) error {
	events, dropped := r.Events()
	out := make([]chromeEvent, 0, len(events)+3)
	out = append(out,
		chromeEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": name}},
		chromeEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: TidCompute, Args: map[string]any{"name": "compute"}},
		chromeEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: TidComm, Args: map[string]any{"name": "all-reduce"}},
	)
	for _, e := range events {
		c := chromeEvent{Name: e.Name, Cat: e.Cat, Ph: string(rune(e.Phase)), Ts: us(e.Start.Sub(r.origin)), Pid: pid, Tid: e.Tid, Args: e.Args}
		switch e.Phase {
		case 'X':
			d := us(e.Dur)
			c.Dur = &d
		case 'i':
			c.Scope = "t"
		default:
			return fmt.Errorf("trace: event %q: phase %q", e.Name, e.Phase)
		}
		out = append(out, c)
	}
	other := map[string]string{"dropped_events": fmt.Sprint(dropped)}
	for k, v := range meta {
		other[k] = v
	}
	enc := json.NewEncoder(w)
	return enc.Encode(struct {
		TraceEvents     []chromeEvent     `json:"traceEvents"`
		DisplayTimeUnit string            `json:"displayTimeUnit"`
		OtherData       map[string]string `json:"otherData"`
	}{out, "ms", other})
}

// Validate checks b against Chrome's trace-event format (the JSON
// object form): a traceEvents array whose every event has a string name,
// a phase among those written here (X complete, i instant, M metadata),
// integer pid and tid, and for X and i a non-negative numeric ts; X
// events a non-negative dur, instants a scope g, p or t, metadata events
// an args.name. It returns the events.
func Validate(b []byte) ([]map[string]any, error) {
	var f struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	if f.TraceEvents == nil {
		return nil, fmt.Errorf("no traceEvents array")
	}
	isInt := func(v any) bool { x, ok := v.(float64); return ok && x == math.Trunc(x) }
	for i, e := range f.TraceEvents {
		if _, ok := e["name"].(string); !ok {
			return nil, fmt.Errorf("event %d: name %v", i, e["name"])
		}
		if !isInt(e["pid"]) || !isInt(e["tid"]) {
			return nil, fmt.Errorf("event %d: pid %v tid %v", i, e["pid"], e["tid"])
		}
		ph, _ := e["ph"].(string)
		switch ph {
		case "X", "i":
			if ts, ok := e["ts"].(float64); !ok || ts < 0 {
				return nil, fmt.Errorf("event %d: ts %v", i, e["ts"])
			}
			if ph == "X" {
				if d, ok := e["dur"].(float64); !ok || d < 0 {
					return nil, fmt.Errorf("event %d: dur %v", i, e["dur"])
				}
			} else if s := e["s"]; s != "g" && s != "p" && s != "t" {
				return nil, fmt.Errorf("event %d: instant scope %v", i, s)
			}
		case "M":
			args, _ := e["args"].(map[string]any)
			if _, ok := args["name"].(string); !ok {
				return nil, fmt.Errorf("event %d: metadata without args.name", i)
			}
		default:
			return nil, fmt.Errorf("event %d: phase %q", i, ph)
		}
	}
	return f.TraceEvents, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
