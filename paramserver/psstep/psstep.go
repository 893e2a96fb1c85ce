// Package psstep is the parameter-server protocol of one training step,
// written once for both of its sides: the exchanges between a rank and
// one shard, in order (Plan, AskState), and what each side computes at
// each of them. The worker (worker/pscompress.go) and the shard's
// stream handler (package paramserver) walk the same plan from their two
// ends and do only the I/O: frames in and out, waits, timeouts.
//
// Where each piece lives:
//
//   - The order of a step's exchanges: Plan and AskState (psstep.go).
//   - The shard's arithmetic of a consistency-sync step: Shard
//     (sides.go) sums the ranks' pushes (aggregator.SyncShard), combines
//     PowerSGD's phases (compress.PSReceiver: P orthogonalised from ΣP_i,
//     Q = ΣQ_i/n, the gradient P·Qᵀ), applies the averaged gradient, and
//     gives the values the shard answers each exchange with (Answer).
//   - The rank's arithmetic: Rank (sides.go) pushes the gradient or
//     PowerSGD's Q_i from the P it was answered, keeps the factors the
//     shard sends, and moves the rank's compression state on once the
//     step is applied (compress.PSPusher: error feedback, warm start).
//   - Whether a checkpoint is due after a step, and whether it must
//     gather the ranks' own compression state first: Checkpoints
//     (checkpoint.go), which also follows the ranks' sampler position
//     from the step count.
//   - Lag bookkeeping: Lags, how late each rank's push arrives at a
//     sync shard (the coordinator's straggler attribution); Staleness, a
//     rank's sums of its async or bounded shards' receipts (lags.go).
//   - The wire encoding of compress's push frames: DType, Frame,
//     FrameSender (frames.go, the only file that knows the proto types).
//   - An entrypoint job's script in mode ps, whose shards only sum
//     (as BytePS's servers): Call, one collective call of the script as
//     every rank makes it, and the shard's piece of it (Call.Piece);
//     Calls, the shard's side, which combines the ranks' calls one at a
//     time (calls.go).
//
// The maths itself (the encodings, PowerSGD's products, orthogonalisation)
// stays in compress over []float32, and the shard cores (sync, and
// async/bounded with its clocks) in aggregator. Apart from frames.go the
// package is pure: no proto, no gRPC, no goroutines, no clock (times are
// passed in); its types are not safe for concurrent use (the callers
// serialise: paramserver under its shard's lock, the worker per link).
//
// A step s of a job whose compression pushes once (no compression,
// fp16/bf16, int8, top-k, and every scheme before its start step):
//
//	rank → shard  Push     phase 0, tagged s: the gradient
//	shard → rank  Params   tagged s+1: the parameters after the step
//
// With PowerSGD from its start step:
//
//	rank → shard  Push     phase 1, tagged s: P_i and the uncompressed tensors
//	shard → rank  Factors  phase 1, tagged s: the orthogonalised sum of P
//	rank → shard  Push     phase 2, tagged s: Q_i
//	shard → rank  Params   tagged s+1
//	shard → rank  SharedQ  phase 2, tagged s+1: the averaged Q (warm start)
//
// When a checkpoint is due after the step and the ranks hold their own
// compression state (error feedback; Checkpoints.Due says Gather),
// Params asks for it (send_state) and two more exchanges follow
// (AskState):
//
//	rank → shard  State    tagged s+1: the rank's own state
//	shard → rank  Written  checkpoint_written
package psstep

import (
	"fmt"

	"github.com/gradsync/gradsync/compress"
)

// Kind is what one exchange carries, and so who sends it.
type Kind uint8

const (
	// Push (rank → shard) is one push of the step: Exchange.Push says
	// its phase, dtype and length.
	Push Kind = iota + 1
	// Factors (shard → rank) is PowerSGD's orthogonalised P after phase 1.
	Factors
	// Params (shard → rank) is the parameters after the step.
	Params
	// SharedQ (shard → rank) is PowerSGD's averaged Q after phase 2.
	SharedQ
	// State (rank → shard) is the rank's own compression state.
	State
	// Written (shard → rank) says the checkpoint is on disk.
	Written
)

var kindNames = [...]string{Push: "push", Factors: "factors", Params: "params", SharedQ: "shared-q", State: "state", Written: "written"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// FromRank reports whether the rank sends exchanges of kind k.
func (k Kind) FromRank() bool { return k == Push || k == State }

// Exchange is one message exchange of a step: one tensor (or, for
// Written, one flag) sent as frames tagged Step.
type Exchange struct {
	Kind Kind
	// Step is the step the frames are tagged with: the step itself for
	// the pushes and Factors, the next step for Params, SharedQ and
	// State (they belong to the parameters after the step).
	Step int64
	// Phase is the phase the frames are tagged with: Push.Phase for a
	// push, 1 for Factors, 2 for SharedQ, 0 otherwise.
	Phase uint32
	// Push is the push (Kind Push only).
	Push compress.PSPhase
}

func (e Exchange) String() string {
	if e.Kind == Push {
		return fmt.Sprintf("%v phase %d step %d (%v, %d elements)", e.Kind, e.Phase, e.Step, e.Push.Encoding, e.Push.Total)
	}
	return fmt.Sprintf("%v phase %d step %d", e.Kind, e.Phase, e.Step)
}

// Plan returns the exchanges of step, in order, given its pushes (the
// Phases of compress's PS halves for the step: one, or PowerSGD's two);
// the state exchanges a due checkpoint adds are AskState's. A phase
// that is not the last is answered with its factors (PowerSGD's P).
func Plan(step int64, phases []compress.PSPhase) []Exchange {
	if len(phases) == 0 {
		panic("psstep: a step without pushes")
	}
	out := make([]Exchange, 0, 2*len(phases)+1)
	for i, ph := range phases {
		out = append(out, Exchange{Kind: Push, Step: step, Phase: ph.Phase, Push: ph})
		if i < len(phases)-1 {
			out = append(out, Exchange{Kind: Factors, Step: step, Phase: ph.Phase})
		}
	}
	out = append(out, Exchange{Kind: Params, Step: step + 1})
	if phases[len(phases)-1].Phase == 2 {
		out = append(out, Exchange{Kind: SharedQ, Step: step + 1, Phase: 2})
	}
	return out
}

// AskState returns the exchanges that follow step's when its Params
// asked for the rank's own compression state.
func AskState(step int64) []Exchange {
	return []Exchange{{Kind: State, Step: step + 1}, {Kind: Written, Step: step + 1}}
}
