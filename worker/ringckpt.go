package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/models"
)

// Compression state in a checkpoint's extra.safetensors, as the flat
// buffers of compress.Flat (the layout follows from the spec, which the
// checkpoint's spec hash pins):
//
//	compress.shared      the state every rank shares (PowerSGD's Q),
//	                     present once it is set
//	compress.rank<r>.own rank r's own state (error-feedback residuals),
//	                     for every rank whose state reached rank 0
const (
	extraShared    = "compress.shared"
	extraOwnPrefix = "compress.rank"
	extraOwnSuffix = ".own"
)

func extraOwnName(rank int) string { return extraOwnPrefix + strconv.Itoa(rank) + extraOwnSuffix }

// gathersCompression reports whether checkpoints of this ring need the
// other ranks' compression state (error feedback), so that every rank
// takes part in writing them.
func (r *ringSync) gathersCompression() bool {
	_, own := r.state.FlatLen()
	return own > 0 && r.world > 1
}

// compressionExtra returns the compression state for a checkpoint:
// the shared part and this rank's own, plus, when gather is true, every
// other rank's own, all-gathered over the ring (every rank must call it
// at the same step then). gather false (the ring is broken, at a
// cancellation) records this rank's own only; the others then restart
// from zero residuals.
func (r *ringSync) compressionExtra(ctx context.Context, gather bool) (map[string]models.Tensor, error) {
	ns, no := r.state.FlatLen()
	fl := &compress.Flat{Shared: make([]float32, ns), Own: make([]float32, no)}
	r.state.CopyState(fl)
	out := map[string]models.Tensor{}
	if fl.SharedSet && ns > 0 {
		out[extraShared] = models.F32Tensor([]int{ns}, fl.Shared)
	}
	if no == 0 {
		return out, nil
	}
	me := r.ring.Rank()
	if !gather || r.world == 1 {
		out[extraOwnName(me)] = models.F32Tensor([]int{no}, fl.Own)
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	all := make([]float32, no*r.world)
	if err := aggregator.AllGather(ctx, r.ring, all, fl.Own, r.seq, r.opt); err != nil {
		return nil, fmt.Errorf("gathering the ranks' compression state: %w", r.explain(ctx, err))
	}
	r.seq--
	for k := range r.world {
		out[extraOwnName(k)] = models.F32Tensor([]int{no}, all[k*no:(k+1)*no])
	}
	return out, nil
}

// decideCheckpoint makes rank 0's decision every rank's: with
// every_seconds the decision depends on rank 0's clock, so it is
// broadcast; the step and epoch conditions every rank evaluates alike.
// Only rings that gather compression state call it on every rank.
func (r *ringSync) decideCheckpoint(ctx context.Context, due bool, timed bool) (bool, error) {
	if !timed {
		return due, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	flag := []float32{float32(boolInt(due))}
	if err := aggregator.Broadcast(ctx, r.ring, flag, 0, r.seq, r.opt); err != nil {
		return false, fmt.Errorf("agreeing on a checkpoint: %w", r.explain(ctx, err))
	}
	r.seq--
	return flag[0] != 0, nil
}

// restoreCompression loads the compression state of a checkpoint into
// rank's reducer. The shared part (PowerSGD's Q) is restored whatever the
// world size. A rank's own residuals are restored only when the
// checkpoint was written by as many ranks as there are now and holds
// that rank's: with another world size rank numbers no longer name the
// same data shards, and the residuals are reset to zero (logged).
func restoreCompression(st *checkpoint.State, rank, world int, red compress.Stateful, log *slog.Logger, job string) error {
	ns, no := red.FlatLen()
	fl := &compress.Flat{}
	if t, ok := st.Extra[extraShared]; ok {
		v, err := t.Float32s()
		if err != nil {
			return fmt.Errorf("checkpoint: %s: %w", extraShared, err)
		}
		if len(v) != ns {
			return fmt.Errorf("checkpoint: %s holds %d values, the reducer %d", extraShared, len(v), ns)
		}
		fl.Shared, fl.SharedSet = v, true
	}
	if no > 0 {
		t, ok := st.Extra[extraOwnName(rank)]
		switch {
		case st.Meta.WorldSize != world:
			log.Info("compression error feedback reset: the checkpoint was written by another number of ranks",
				"job", job, "rank", rank, "checkpoint_world", st.Meta.WorldSize, "world", world)
		case !ok:
			log.Info("compression error feedback reset: the checkpoint holds none for this rank (written while the ring was broken)",
				"job", job, "rank", rank)
		default:
			v, err := t.Float32s()
			if err != nil {
				return fmt.Errorf("checkpoint: %s: %w", extraOwnName(rank), err)
			}
			if len(v) != no {
				return fmt.Errorf("checkpoint: %s holds %d values, the reducer %d", extraOwnName(rank), len(v), no)
			}
			fl.Own = v
		}
	}
	if err := red.RestoreState(fl); err != nil {
		return fmt.Errorf("checkpoint: compression state: %w", err)
	}
	return nil
}
