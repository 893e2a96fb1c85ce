package aggregator

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// calibrateReps round trips are timed per probe size; the median is used.
// calibrateWarm untimed round trips of the largest probe come first, so
// that the links' buffers are touched (a shared-memory slot's first write
// faults its pages in) before anything is timed.
const (
	calibrateReps = 7
	calibrateWarm = 8
)

// calibrateSizes are the probe sizes in float32 values (capped at the
// frame limit): empty, 4 KiB, 64 KiB, 1 MiB.
var calibrateSizes = []int{0, 1 << 10, 1 << 14, 1 << 18}

// Calibrate fits a CostModel to the link between ranks 0 and 1 of p with
// a few probe messages, and returns the same model on every rank. Rank 0
// sends each probe size calibrateReps times to rank 1, which echoes it
// (after calibrateWarm untimed round trips of the largest size); half
// the median round trip is the one-way time of that size. α is the
// empty probe's time and β the least-squares slope of the others'
// times above α (a free least-squares line, FitCost, lets a noisy large
// probe drag α anywhere, and α decides the small sizes). Rank 0 then broadcasts the model
// (over PeerRing(p)) so that every rank picks the same algorithm with it.
// Calibrate uses steps step and step+1; all ranks must call it. now
// reads the clock (nil: time.Now). With one rank it returns fallback;
// otherwise the fitted α and β with fallback's Cores.
//
// The model describes one link with nothing else on it; an algorithm's
// real time also depends on how its ranks share the machine, which is
// why the bench reports how often the model's pick was the fastest.
func Calibrate(ctx context.Context, p Peers, step int64, opt Options, now func() time.Time, fallback CostModel) (CostModel, error) {
	if err := opt.Validate(); err != nil {
		return CostModel{}, err
	}
	n, rank := p.Size(), p.Rank()
	if n == 1 {
		return fallback, nil
	}
	if now == nil {
		now = time.Now
	}
	hdr := Frame{Generation: opt.Generation, Op: OpBroadcast, Step: step, Phase: PhaseGather}
	model := make([]float32, 2) // α in ns, β in ns per KiB
	var err error
	switch rank {
	case 0:
		var bytes []int
		var took []time.Duration
		for i, size := range probes(opt) {
			buf := make([]float32, size)
			rtts := make([]time.Duration, probeReps(i))
			for rep := range rtts {
				f := hdr
				f.Chunk, f.Offset, f.Data = uint32(i), rep, buf
				start := now()
				if err = p.Send(ctx, 1, f); err != nil {
					break
				}
				if err = recvProbe(ctx, p, 1, f); err != nil {
					break
				}
				rtts[rep] = now().Sub(start)
			}
			if err != nil {
				break
			}
			if i == 0 {
				continue // the warm-up
			}
			slices.Sort(rtts)
			bytes = append(bytes, 4*size)
			took = append(took, rtts[len(rtts)/2]/2)
		}
		if err == nil {
			alpha := took[0].Seconds()
			var sxy, sxx float64
			for k := 1; k < len(bytes); k++ {
				x := float64(bytes[k])
				sxy += x * (took[k].Seconds() - alpha)
				sxx += x * x
			}
			beta := max(sxy/sxx, 0) * betaScale
			model[0], model[1] = float32(alpha*1e9), float32(beta*1e9)
		}
	case 1:
		for i, size := range probes(opt) {
			buf := make([]float32, size)
			for rep := range probeReps(i) {
				f := hdr
				f.Chunk, f.Offset, f.Data = uint32(i), rep, buf
				if err = recvProbe(ctx, p, 0, f); err != nil {
					break
				}
				if err = p.Send(ctx, 0, f); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return CostModel{}, fmt.Errorf("aggregator: calibrate rank %d/%d: %w", rank, n, err)
	}
	if err := Broadcast(ctx, PeerRing(p), model, 0, step+1, opt); err != nil {
		return CostModel{}, err
	}
	return CostModel{Alpha: time.Duration(model[0]), Beta: time.Duration(model[1]), Cores: fallback.Cores}, nil
}

// probes are the probe sizes in float32 values, capped at the frame
// limit; the first is the warm-up and calibrateSizes[0] must be 0.
func probes(opt Options) []int {
	ps := []int{calibrateSizes[len(calibrateSizes)-1]}
	ps = append(ps, calibrateSizes...)
	for i := range ps {
		ps[i] = min(ps[i], opt.maxFrame())
	}
	return ps
}

func probeReps(i int) int {
	if i == 0 {
		return calibrateWarm
	}
	return calibrateReps
}

// recvProbe receives the probe want (its tags and length) from peer.
func recvProbe(ctx context.Context, p Peers, from int, want Frame) error {
	f, err := p.Recv(ctx, from)
	if err != nil {
		return err
	}
	if f.Generation != want.Generation || f.Op != want.Op || f.Step != want.Step || f.Phase != want.Phase ||
		f.Chunk != want.Chunk || f.Offset != want.Offset || len(f.Data) != len(want.Data) {
		return fmt.Errorf("%w from rank %d: got %s, want %s", ErrUnexpectedFrame, from, tags(f, len(f.Data)), tags(want, len(want.Data)))
	}
	return nil
}
