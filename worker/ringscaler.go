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
// counts), the words of scalerWords. Every rank's scaler holds the same
// state (they see the same reduced gradients), so rank 0's stands for
// all; a resume from the checkpoint restores it on every rank. An
// in-memory snapshot keeps the same state, and a new generation that
// starts from one gets it in the broadcast header (receiveState) on
// every rank, joiners included.
const extraScaler = "amp.loss_scaler"

// scalerWords is a loss scaler's state as the four 64-bit values that
// both a checkpoint (extraScaler) and a snapshot's broadcast carry: the
// scale's float32 bits, the growth tracker, the stepped and skipped
// counts.
func scalerWords(st optim.ScalerState) [4]int64 {
	return [4]int64{int64(math.Float32bits(st.Scale)), int64(st.GrowthTracker), st.Stepped, st.Skipped}
}

// scalerFromWords is scalerWords' inverse; it refuses words that are no
// scale's bits or no int32 tracker (the scaler's Restore checks the
// rest).
func scalerFromWords(v [4]int64) (optim.ScalerState, error) {
	if v[0] < 0 || v[0] > math.MaxUint32 || v[1] < math.MinInt32 || v[1] > math.MaxInt32 {
		return optim.ScalerState{}, fmt.Errorf("%v are not the 4 values of a loss scaler's state", v)
	}
	return optim.ScalerState{Scale: math.Float32frombits(uint32(v[0])), GrowthTracker: int32(v[1]), Stepped: v[2], Skipped: v[3]}, nil
}

// scalerExtra adds the loss scaler's state to a checkpoint's extra
// tensors (nothing without a scaler).
func (r *ringSync) scalerExtra(extra map[string]models.Tensor) {
	if r.scaler == nil {
		return
	}
	data := make([]byte, 32)
	for i, v := range scalerWords(r.scaler.State()) {
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
	if err != nil || len(v) != 4 {
		return fmt.Errorf("checkpoint: %s is not 4 values of a loss scaler's state (%v, %v)", extraScaler, v, err)
	}
	ss, err := scalerFromWords([4]int64(v))
	if err != nil {
		return fmt.Errorf("checkpoint: %s: %w", extraScaler, err)
	}
	if err := s.Restore(ss); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}
