package worker

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// extraScaler names the loss scaler's state (precision fp16) in a ring
// checkpoint's extra.safetensors: an I64 tensor [4] holding the scale's
// float32 bits, the growth tracker, and the stepped and skipped counts
// (GradScaler's state_dict "scale" and "_growth_tracker", plus the
// counts). Every rank's scaler holds the same state (they see the same
// reduced gradients), so rank 0's stands for all; a resume from the
// checkpoint restores it on every rank. A new generation that starts
// from an in-memory snapshot starts every rank's scaler afresh (2^16),
// alike on all ranks.
const extraScaler = "amp.loss_scaler"

// scalerExtra adds the loss scaler's state to a checkpoint's extra
// tensors (nothing without a scaler).
func (r *ringSync) scalerExtra(extra map[string]models.Tensor) {
	if r.scaler == nil {
		return
	}
	st := r.scaler.State()
	data := make([]byte, 32)
	for i, v := range []int64{int64(math.Float32bits(st.Scale)), int64(st.GrowthTracker), st.Stepped, st.Skipped} {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(v))
	}
	extra[extraScaler] = models.Tensor{DType: "I64", Shape: []int{4}, Data: data}
}

// restoreScaler loads a checkpoint's loss-scaler state into s (nil: no
// scaler, nothing to do). A checkpoint without one (written by a job
// in another precision) leaves s as it is.
func restoreScaler(st *checkpoint.State, s *optim.LossScaler) error {
	t, ok := st.Extra[extraScaler]
	if s == nil || !ok {
		return nil
	}
	v, err := t.Int64s()
	if err != nil || len(v) != 4 || v[0] < 0 || v[0] > math.MaxUint32 || v[1] < math.MinInt32 || v[1] > math.MaxInt32 {
		return fmt.Errorf("checkpoint: %s is not 4 values of a loss scaler's state (%v, %v)", extraScaler, v, err)
	}
	if err := s.Restore(optim.ScalerState{Scale: math.Float32frombits(uint32(v[0])), GrowthTracker: int32(v[1]), Stepped: v[2], Skipped: v[3]}); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}
