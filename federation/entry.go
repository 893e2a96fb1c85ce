package federation

import (
	"fmt"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// An entrypoint job's clients are scripts (gradsync.fl): the coordinator
// has no model of its own. Each client joins with its parameters' layout
// (float32 tensors) and its initial parameters, which follow the join as
// frames. The first join sets the layout, and every later one must match
// it. The global model starts from the initial parameters of the
// lowest-index client that joined before the first round opened — client
// 0's when every client joins in time, as Flower takes one client's
// initial parameters —; the others' are read, checked and dropped (each
// client sends its own once, so that no client's crash before the start
// leaves the job without a model). A client that joins after the rounds
// began is checked in the same way.

// Bounds of an entrypoint client's layout.
const (
	maxLayoutTensors = 1 << 16
	// maxEntryParams bounds a script's model (8 GiB of float32 values);
	// the driver holds a few copies of it.
	maxEntryParams = 1 << 31
)

// layoutSize checks a script's layout and returns its number of values.
func layoutSize(ts []*pb.TensorInfo) (int, error) {
	if len(ts) == 0 || len(ts) > maxLayoutTensors {
		return 0, fmt.Errorf("a layout has 1..%d tensors; got %d", maxLayoutTensors, len(ts))
	}
	n := 0
	for i, t := range ts {
		if t.GetName() == "" || len(t.GetName()) > 1024 {
			return 0, fmt.Errorf("tensor %d: name must be 1..1024 bytes", i)
		}
		if t.GetDtype() != "float32" {
			return 0, fmt.Errorf("tensor %q: dtype %q; allowed: float32", t.GetName(), t.GetDtype())
		}
		size := 1
		for _, d := range t.GetShape() {
			if d < 0 || d > maxEntryParams || (d > 0 && size > maxEntryParams/int(d)) {
				return 0, fmt.Errorf("tensor %q: shape %v out of range", t.GetName(), t.GetShape())
			}
			size *= int(d)
		}
		n += size
		if n > maxEntryParams {
			return 0, fmt.Errorf("layout of more than %d values", maxEntryParams)
		}
	}
	return n, nil
}

// layoutDiff names the first difference between two layouts, or "".
func layoutDiff(got, want []*pb.TensorInfo) string {
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g.GetName() != w.GetName() || !slices.Equal(g.GetShape(), w.GetShape()) || g.GetDtype() != w.GetDtype() {
			return fmt.Sprintf("tensor %d is %s %v %s, the job's is %s %v %s", i, g.GetName(), g.GetShape(), g.GetDtype(),
				w.GetName(), w.GetShape(), w.GetDtype())
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d tensors, the job's layout has %d", len(got), len(want))
	}
	return ""
}

// readInitial reads the initial parameters that follow an entrypoint
// client's join (frames op OP_BROADCAST, step 0, phase 2), n values.
func (d *Driver) readInitial(stream pb.Federation_ParticipateServer, client int32, n int) ([]float32, error) {
	out := make([]float32, n)
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: d.jobID, Generation: d.gen, Op: pb.Op_OP_BROADCAST, Step: 0, Total: uint64(n)}, 2)
	for !asm.Done() {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		f := m.GetDelta()
		if f == nil {
			return nil, status.Errorf(codes.InvalidArgument, "client %d: %T before its initial parameters ended", client, m.Msg)
		}
		if err := asm.Copy(out, f); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "client %d: initial parameters: %v", client, err)
		}
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, status.Errorf(codes.InvalidArgument, "client %d: initial parameter %d is %v; want a finite number", client, i, v)
		}
	}
	return out, nil
}

// entryJoinLocked checks an entrypoint client's layout against the job's
// (the first join sets it) and keeps its initial parameters when the
// global model is to start from them.
func (d *Driver) entryJoinLocked(client int, layout []*pb.TensorInfo, n int, initial []float32) error {
	if d.layout == nil {
		d.layout, d.params = layout, n
		d.log.Info("federated model layout", "job", d.jobID, "from_client", client, "tensors", len(layout), "params", n)
	} else if diff := layoutDiff(layout, d.layout); diff != "" {
		return status.Errorf(codes.InvalidArgument, "client %d's parameters differ from the job's layout (set by the first client to join): %s", client, diff)
	}
	if !d.begun && (d.initial == nil || client < d.initialFrom) {
		d.initial, d.initialFrom = initial, client
	}
	return nil
}

// entryServerLocked makes an entrypoint job's round state machine as its
// first round opens, from the initial parameters kept; false when no
// client has joined (the job has failed).
func (d *Driver) entryServerLocked() bool {
	if d.initial == nil {
		d.failLocked(fmt.Sprintf("no client joined within %v of the job's start (the longer of the round deadline and the step timeout): no initial parameters (a script calls gradsync.fl.start)",
			jobspec.FedJoinWait(d.spec)))
		return false
	}
	srv, err := federated.NewServer(d.srvCfg, d.strat, d.initial)
	if err != nil {
		d.failLocked(err.Error()) // New validated the config
		return false
	}
	d.srv = srv
	d.log.Info("federated global model starts from a client's initial parameters", "job", d.jobID, "client", d.initialFrom)
	d.logLocked(map[string]any{"kind": "initial_parameters", "client": d.initialFrom, "params": d.params})
	d.initial = nil
	return true
}

// leftLocked: client c's worker says the client can take no further part
// (its script crashed or hung): it is lost, as a lost worker's client is.
// Its stream stays open, idle, until the job ends.
func (d *Driver) leftLocked(c *session, reason string) {
	if len(reason) > 4096 {
		reason = reason[:4096] + "…"
	}
	d.log.Warn("federated client left", "job", d.jobID, "client", c.client, "worker", d.workers[c.client], "reason", reason)
	d.leaveLocked(c)
	if d.activeLocked() {
		d.clientLostLocked(c.client, d.workers[c.client], "its client left: "+reason)
	}
}

// Bounds of a client's own metrics.
const (
	maxMetrics    = 64
	maxMetricName = 128
)

// checkMetrics refuses metrics the run log cannot hold.
func checkMetrics(m map[string]float64) error {
	if len(m) > maxMetrics {
		return fmt.Errorf("%d metrics; at most %d", len(m), maxMetrics)
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetricName {
			return fmt.Errorf("metric name %q: must be 1..%d bytes", k, maxMetricName)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("metric %s is %v; want a finite number", k, v)
		}
	}
	return nil
}

// metricsLocked records a client's own metrics of a fit or evaluation
// (a script's) in the run log.
func (d *Driver) metricsLocked(client, round int, phase string, m map[string]float64) {
	if len(m) == 0 {
		return
	}
	d.logLocked(map[string]any{"kind": "client_metrics", "client": client, "round": round, "phase": phase, "metrics": m})
}
