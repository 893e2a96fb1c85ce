package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// A pipeline job's recovery. After every step each rank keeps an
// in-memory snapshot of its stage (parameters, buffers, optimiser state,
// position), in the worker's snapshot store, tagged with the stage
// (jobSnapshots.stage). When an elastic pipeline job loses a worker the
// coordinator starts a new generation on whole replicas of the stages
// (coordinator.PlanStages), each survivor on the stage it held where it
// can be; the ranks then agree on a step whose snapshot some rank holds
// for every stage (choosePipeMemory), and each stage's snapshot is
// broadcast over the job's ring from the lowest rank holding it to the
// ranks of that stage (a survivor may have changed stage; a replacement
// worker holds nothing). Without such a step the generation starts from
// the checkpoint, and with neither it fails once steps were trained.

// pipeSnapInfo is what a rank tells the others about its snapshots: the
// generation and stage they belong to and the steps of the newest and
// the older one (-1: none).
type pipeSnapInfo struct {
	snapInfo
	stage int64
}

// pipeInfoLen is the length of an encoded pipeSnapInfo.
const pipeInfoLen = infoLen + 4

func (s pipeSnapInfo) encode(dst []float32) {
	s.snapInfo.encode(dst[:infoLen])
	putInt64(dst[infoLen:], s.stage)
}

func decodePipeInfo(src []float32) pipeSnapInfo {
	return pipeSnapInfo{snapInfo: decodeInfo(src[:infoLen]), stage: getInt64(src[infoLen:])}
}

// pipeMemoryChoice is the in-memory state a pipeline generation can
// start from: step (-1: none) and, by stage, the rank that sends it.
type pipeMemoryChoice struct {
	step   int64
	src    []int
	gen    uint64
	newest int64 // the newest step any counted rank reached (-1: none)
}

// choosePipeMemory is the agreement's pure core: infos[r] is rank r's,
// gen the new generation, stages the job's. Only snapshots of the newest
// earlier generation count (as chooseMemory). The replicas of a stage
// hold the same parameters after every step and the stages of a
// generation are at most one step apart (every step ends with an
// all-reduce over all ranks), so the newest step that some rank of every
// stage holds is a consistent state of the whole model. The sender of a
// stage is the lowest rank holding it.
func choosePipeMemory(infos []pipeSnapInfo, gen uint64, stages int) pipeMemoryChoice {
	c := pipeMemoryChoice{step: -1, newest: -1}
	found := false
	for _, in := range infos {
		if in.newest >= 0 && in.gen < gen && (!found || in.gen > c.gen) {
			c.gen, found = in.gen, true
		}
	}
	if !found {
		return c
	}
	holds := func(in pipeSnapInfo, step int64) bool {
		return in.newest >= 0 && in.gen == c.gen && (in.newest == step || in.older == step)
	}
	var steps []int64 // candidates: every step a counted rank holds
	for _, in := range infos {
		if in.newest >= 0 && in.gen == c.gen {
			c.newest = max(c.newest, in.newest)
			steps = append(steps, in.newest, in.older)
		}
	}
	src := make([]int, stages)
	for _, step := range steps {
		if step < 0 || step <= c.step {
			continue
		}
		ok := true
		for s := range stages {
			src[s] = -1
			for r, in := range infos {
				if in.stage == int64(s) && holds(in, step) {
					src[s] = r
					break
				}
			}
			ok = ok && src[s] >= 0
		}
		if ok {
			c.step, c.src = step, append([]int(nil), src...)
		}
	}
	return c
}

// pipeStateHeader: step, epoch, consumed, the optimiser-state flag, Adam's
// step count, and the lengths of the parameters, buffers and optimiser
// state that follow, as 64-bit values in 16-bit pieces.
const pipeStateHeader = 8 * 4

// agree brings every rank of a new generation of a pipeline job to the
// state it starts from (see the top of this file); ckptStep is the
// checkpoint's step (-1: none), trainedSteps what the job is known to
// have trained.
func (p *pipeTask) agree(ctx context.Context, ckptStep, trainedSteps int64) (startPoint, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	gen := p.a.Generation
	mine := pipeSnapInfo{snapInfo: snapInfo{newest: -1, older: -1}, stage: -1}
	if s := p.snaps.latest(); s != nil && s.gen < gen {
		mine = pipeSnapInfo{snapInfo: snapInfo{gen: s.gen, newest: s.step, older: p.snaps.olderStep()}, stage: int64(p.snaps.stage)}
	}
	var enc [pipeInfoLen]float32
	mine.encode(enc[:])
	world := int(p.a.WorldSize)
	all := make([]float32, pipeInfoLen*world)
	if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
		return aggregator.AllGather(ctx, p.world, all, enc[:], seq, p.opt)
	}); err != nil {
		return startPoint{}, fmt.Errorf("agreeing on the state to start from: %w", err)
	}
	infos := make([]pipeSnapInfo, world)
	for r := range infos {
		infos[r] = decodePipeInfo(all[r*pipeInfoLen : (r+1)*pipeInfoLen])
	}
	c := choosePipeMemory(infos, gen, p.coord.Stages)
	sp := startPoint{newest: c.newest, srcRank: -1}
	switch {
	case c.step >= 0 && c.step >= ckptStep:
		for s, src := range c.src {
			if err := p.receiveStage(ctx, s, src, c.step, &sp); err != nil {
				return startPoint{}, err
			}
		}
		sp.source, sp.srcRank = fromMemory, c.src[0]
	case ckptStep >= 0:
		sp.source = fromCheckpoint
	case trainedSteps > 0:
		return startPoint{}, fmt.Errorf("no state to go on from: no rank of generation %d holds an in-memory snapshot of every pipeline stage at one step and the job has no checkpoint, "+
			"but %d steps had been trained", gen, trainedSteps)
	default:
		// Every stage builds the whole model's initial values of its
		// part (models.NewStage): scratch needs no collective.
		sp.source = fromScratch
	}
	sp.took = time.Since(t0)
	return sp, nil
}

// receiveStage broadcasts stage s's snapshot of step from rank src over
// the job's ring; the ranks of stage s load it.
func (p *pipeTask) receiveStage(ctx context.Context, s, src int, step int64, sp *startPoint) error {
	me := p.coord.Rank
	var own *snapshot
	if me == src {
		if own = p.snaps.at(step); own == nil || p.snaps.stage != s {
			panic("worker: the chosen rank does not hold the chosen stage's snapshot")
		}
	}
	var hdr [pipeStateHeader]float32
	if own != nil {
		nOpt := 0
		if own.optSet {
			nOpt = len(own.optA) + len(own.optB)
		}
		for i, v := range []int64{own.step, int64(own.epoch), own.consumed, boolInt(own.optSet), int64(own.adamT),
			int64(len(own.params)), int64(len(own.bufs)), int64(nOpt)} {
			putInt64(hdr[4*i:], v)
		}
	}
	bcast := func(b []float32) error {
		return p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
			return aggregator.Broadcast(ctx, p.world, b, src, seq, p.opt)
		})
	}
	if err := bcast(hdr[:]); err != nil {
		return fmt.Errorf("receiving stage %d's snapshot of step %d from rank %d: %w", s, step, src, err)
	}
	var h [8]int64
	for i := range h {
		h[i] = getInt64(hdr[4*i:])
	}
	np, nb, nOpt := int(h[5]), int(h[6]), int(h[7])
	if h[0] != step || np < 0 || nb < 0 || nOpt < 0 || nOpt > 2*np {
		return fmt.Errorf("rank %d sent stage %d's snapshot of step %d with %d parameters, %d buffer values and %d of optimiser state; want step %d",
			src, s, h[0], np, nb, nOpt, step)
	}
	if s == p.coord.Stage && (np != len(p.net.Params()) || nb != len(p.net.Buffers())) {
		return fmt.Errorf("rank %d sent stage %d's snapshot with %d parameters and %d buffer values; this rank's stage holds %d and %d",
			src, s, np, nb, len(p.net.Params()), len(p.net.Buffers()))
	}
	body := make([]float32, np+nb+nOpt)
	if own != nil {
		copy(body, own.params)
		copy(body[np:], own.bufs)
		copy(body[np+nb:], own.optA)
		copy(body[np+nb+len(own.optA):], own.optB)
	}
	if err := bcast(body); err != nil {
		return fmt.Errorf("receiving stage %d's snapshot of step %d from rank %d: %w", s, step, src, err)
	}
	sp.step, sp.epoch, sp.consumed = h[0], int(h[1]), h[2]
	if s != p.coord.Stage {
		return nil
	}
	st := snapshot{step: h[0], optSet: h[3] != 0, adamT: int(h[4]), params: body[:np], bufs: body[np : np+nb]}
	opt := body[np+nb:]
	switch p.optim.(type) {
	case *optim.SGD:
		st.optA = opt
	case *optim.Adam:
		st.optA, st.optB = opt[:len(opt)/2], opt[len(opt)/2:]
	}
	return st.restore(p.net, p.optim, nil)
}

// noReducerState is the compression state of a pipeline stage (none:
// compression is refused with stages), for jobSnapshots.take.
type noReducerState struct{}

func (noReducerState) State() map[string]models.Tensor         { return nil }
func (noReducerState) SetState(map[string]models.Tensor) error { return nil }
func (noReducerState) FlatLen() (int, int)                     { return 0, 0 }
func (noReducerState) CopyState(*compress.Flat)                {}
func (noReducerState) RestoreState(*compress.Flat) error       { return nil }

// snapshot takes this stage's in-memory snapshot of the state at at.
func (p *pipeTask) snapshot(at position) {
	p.snaps.stage = p.coord.Stage
	p.snaps.take(p.a.Generation, at.step, at.epoch, at.consumed, p.net, p.optim, noReducerState{}, nil)
}

// reportStart tells the coordinator (rank 0) where the generation's
// state came from.
func (p *pipeTask) reportStart(sp startPoint, at position) {
	if p.coord.Rank != 0 {
		return
	}
	st := &pb.TaskStarted{JobId: p.a.JobId, Generation: p.a.Generation, Rank: p.a.Rank, Step: at.step, Source: sp.source,
		SourceRank: int32(sp.srcRank), NewestStep: sp.newest, AgreeSeconds: sp.took.Seconds()}
	if sp.source == fromCheckpoint {
		st.Checkpoint = p.a.ResumeFrom
	}
	p.env.rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Started{Started: st}})
}
