package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// snapInfo is what a rank tells the others about its snapshots when a
// generation starts: the generation they belong to and the steps of the
// newest and the older one (-1: none).
type snapInfo struct {
	gen           uint64
	newest, older int64
}

// infoLen is the length of an encoded snapInfo: three 64-bit values as
// four 16-bit halves each (exact in float32).
const infoLen = 12

func (s snapInfo) encode(dst []float32) {
	putInt64(dst[0:4], int64(s.gen))
	putInt64(dst[4:8], s.newest)
	putInt64(dst[8:12], s.older)
}

func decodeInfo(src []float32) snapInfo {
	return snapInfo{gen: uint64(getInt64(src[0:4])), newest: getInt64(src[4:8]), older: getInt64(src[8:12])}
}

// putInt64 writes v as four 16-bit pieces, each exact in a float32.
func putInt64(dst []float32, v int64) {
	u := uint64(v)
	for i := range 4 {
		dst[i] = float32(uint16(u >> (16 * i)))
	}
}

func getInt64(src []float32) int64 {
	var u uint64
	for i := range 4 {
		u |= uint64(uint16(src[i])) << (16 * i)
	}
	return int64(u)
}

// memoryChoice is the in-memory state a generation can start from.
type memoryChoice struct {
	step   int64  // the agreed step; -1: no state every holder shares
	src    int    // the lowest rank holding it, which broadcasts it
	gen    uint64 // the generation of the snapshots considered
	newest int64  // the newest step any of them reached (-1: none)
}

// chooseMemory is the agreement's pure core. infos[r] is rank r's; gen is
// the new generation. Only snapshots of the newest earlier generation
// count: a rank holding older ones (it was out of the job for a while,
// or the coordinator restarted and generations start again from 1)
// counts as a rank with nothing, like a joiner. Every counted rank must
// hold the chosen step, so that each can restore its own error feedback
// at exactly that step; the newest step they all hold is chosen. Ranks of
// one generation are at most one step apart (no rank completes step s+1
// before every rank has completed step s) and each keeps two snapshots,
// so that is the newest step of the slowest rank.
func chooseMemory(infos []snapInfo, gen uint64) memoryChoice {
	c := memoryChoice{step: -1, src: -1, newest: -1}
	found := false
	for _, in := range infos {
		if in.newest >= 0 && in.gen < gen && (!found || in.gen > c.gen) {
			c.gen, found = in.gen, true
		}
	}
	if !found {
		return c
	}
	var common []int64 // the steps every counted rank holds
	first := true
	for _, in := range infos {
		if in.newest < 0 || in.gen != c.gen {
			continue
		}
		c.newest = max(c.newest, in.newest)
		held := []int64{in.newest}
		if in.older >= 0 {
			held = append(held, in.older)
		}
		if first {
			common, first = held, false
			continue
		}
		var keep []int64
		for _, s := range common {
			if s == held[0] || (len(held) > 1 && s == held[1]) {
				keep = append(keep, s)
			}
		}
		common = keep
	}
	for _, s := range common {
		c.step = max(c.step, s)
	}
	if c.step < 0 {
		return c
	}
	for r, in := range infos {
		if in.newest >= 0 && in.gen == c.gen && (in.newest == c.step || in.older == c.step) {
			c.src = r
			break
		}
	}
	return c
}

// startPoint is where a generation starts training.
type startPoint struct {
	step     int64
	epoch    int
	consumed int64
	source   string // fromMemory, fromCheckpoint or fromScratch
	srcRank  int    // with fromMemory: the rank whose snapshot it was
	newest   int64  // the newest step any rank had a snapshot of (-1: none)
	took     time.Duration
}

// stateHeader is the length of the broadcast state's header: step,
// epoch, consumed, the optimiser-state flag, Adam's step count, the
// shared-compression-state flag, the loss-scaler flag and the scaler's
// four words (scalerWords; zero without a scaler), as 64-bit values in
// 16-bit pieces.
const stateHeader = 11 * 4

// agree brings every rank of a new generation to the same state before
// training, from the newest state anybody holds:
//
//  1. every rank all-gathers what snapshots it has (snapInfo);
//  2. chooseMemory picks a step m every counted rank holds; if that is at
//     least as new as the checkpoint (ckptStep, -1 without), the lowest
//     rank holding m broadcasts its snapshot m — parameters, buffers,
//     optimiser state, step, epoch and sampler position, the loss
//     scaler's state (precision fp16), and the compression state all
//     ranks share (PowerSGD's Q);
//  3. otherwise the caller loads the checkpoint, or, with neither, rank
//     0's freshly built parameters are broadcast — unless trainedSteps > 0,
//     when starting over would silently throw work away: that is an error.
//
// Error feedback is a rank's own: it is the part of that worker's past
// gradients that compression has not sent yet, and nobody else can rebuild
// it. A rank that holds snapshot m restores its own residual from it,
// whatever rank number it has now and whatever the new world size: the
// residual is in units of a local gradient, so it stays meaningful when
// ranks are renumbered, and dropping it would lose gradient mass that
// error feedback exists to keep (a lost worker's residual is lost with
// it). A rank without snapshot m (a joiner) starts with zero residual.
// A checkpoint restores residuals by rank only with the same world size
// (see restoreCompression).
//
// All ranks reach the same decision from the same all-gathered data, so
// the collectives they run match.
func (r *ringSync) agree(ctx context.Context, snaps *jobSnapshots, gen uint64, ckptStep, trainedSteps int64, net *models.Network) (startPoint, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	mine := snapInfo{newest: -1, older: -1}
	if s := snaps.latest(); s != nil && s.gen < gen {
		mine = snapInfo{gen: s.gen, newest: s.step, older: snaps.olderStep()}
	}
	var enc [infoLen]float32
	mine.encode(enc[:])
	all := make([]float32, infoLen*r.world)
	if err := aggregator.AllGather(ctx, r.ring, all, enc[:], r.seq, r.opt); err != nil {
		return startPoint{}, fmt.Errorf("agreeing on the state to start from: %w", r.explain(ctx, err))
	}
	r.seq--
	infos := make([]snapInfo, r.world)
	for i := range infos {
		infos[i] = decodeInfo(all[i*infoLen : (i+1)*infoLen])
	}
	c := chooseMemory(infos, gen)
	sp := startPoint{newest: c.newest, srcRank: -1}
	switch {
	case c.step >= 0 && c.step >= ckptStep:
		if err := r.receiveState(ctx, snaps, c, mine, net, &sp); err != nil {
			return startPoint{}, err
		}
		sp.source, sp.srcRank = fromMemory, c.src
	case ckptStep >= 0:
		sp.source = fromCheckpoint
	case trainedSteps > 0:
		return startPoint{}, fmt.Errorf("no state to go on from: no rank of generation %d holds an in-memory snapshot and the job has no checkpoint, "+
			"but %d steps had been trained (every worker that held the state was lost)", gen, trainedSteps)
	default:
		if err := r.broadcastParams(ctx, net.Params()); err != nil {
			return startPoint{}, err
		}
		sp.source = fromScratch
	}
	sp.took = time.Since(t0)
	return sp, nil
}

// receiveState broadcasts snapshot c.step from rank c.src and loads it on
// every rank, with each rank's own error feedback (see agree).
func (r *ringSync) receiveState(ctx context.Context, snaps *jobSnapshots, c memoryChoice, mine snapInfo, net *models.Network, sp *startPoint) error {
	me := r.ring.Rank()
	var own *snapshot // this rank's snapshot c.step, if it counts
	if mine.newest >= 0 && mine.gen == c.gen {
		own = snaps.at(c.step)
	}
	if me == c.src && own == nil {
		panic("worker: the chosen rank does not hold the chosen snapshot")
	}
	nShared, _ := r.state.FlatLen()
	var hdr [stateHeader]float32
	if me == c.src {
		putInt64(hdr[0:], own.step)
		putInt64(hdr[4:], int64(own.epoch))
		putInt64(hdr[8:], own.consumed)
		putInt64(hdr[12:], boolInt(own.optSet))
		putInt64(hdr[16:], int64(own.adamT))
		putInt64(hdr[20:], boolInt(own.red.SharedSet))
		putInt64(hdr[24:], boolInt(own.scalerSet))
		for i, w := range scalerWords(own.scaler) {
			putInt64(hdr[28+4*i:], w)
		}
	}
	if err := aggregator.Broadcast(ctx, r.ring, hdr[:], c.src, r.seq, r.opt); err != nil {
		return fmt.Errorf("receiving the snapshot of step %d from rank %d: %w", c.step, c.src, r.explain(ctx, err))
	}
	r.seq--
	st := snapshot{step: getInt64(hdr[0:]), epoch: int(getInt64(hdr[4:])), consumed: getInt64(hdr[8:]),
		optSet: getInt64(hdr[12:]) != 0, adamT: int(getInt64(hdr[16:]))}
	st.red.SharedSet = getInt64(hdr[20:]) != 0
	if st.step != c.step {
		return fmt.Errorf("rank %d sent the snapshot of step %d, want %d", c.src, st.step, c.step)
	}
	if st.scalerSet = getInt64(hdr[24:]) != 0; st.scalerSet {
		var w [4]int64
		for i := range w {
			w[i] = getInt64(hdr[28+4*i:])
		}
		var err error
		if st.scaler, err = scalerFromWords(w); err != nil {
			return fmt.Errorf("the snapshot of step %d from rank %d: loss scaler: %w", c.step, c.src, err)
		}
	}
	// The body: parameters, buffers, optimiser state, shared compression
	// state; its layout follows from the header and the spec.
	np, nb := len(net.Params()), len(net.Buffers())
	nOpt := 0
	if st.optSet {
		switch r.optim.(type) {
		case *optim.SGD:
			nOpt = np
		case *optim.Adam:
			nOpt = 2 * np
		}
	}
	ns := 0
	if st.red.SharedSet {
		ns = nShared
	}
	body := make([]float32, np+nb+nOpt+ns)
	params, bufs := body[:np], body[np:np+nb]
	optA, optB := body[np+nb:np+nb+min(nOpt, np)], body[np+nb+min(nOpt, np):np+nb+nOpt] // SGD: optB empty
	shared := body[np+nb+nOpt:]
	if me == c.src {
		copy(params, own.params)
		copy(bufs, own.bufs)
		copy(optA, own.optA)
		copy(optB, own.optB)
		copy(shared, own.red.Shared)
	}
	if err := aggregator.Broadcast(ctx, r.ring, body, c.src, r.seq, r.opt); err != nil {
		return fmt.Errorf("receiving the snapshot of step %d from rank %d: %w", c.step, c.src, r.explain(ctx, err))
	}
	r.seq--
	st.params, st.bufs, st.optA, st.optB = params, bufs, optA, optB
	if err := st.restore(net, r.optim, r.scaler); err != nil {
		return err
	}
	fl := &compress.Flat{Shared: shared, SharedSet: st.red.SharedSet}
	if own != nil {
		fl.Own = own.red.Own
	}
	if err := r.state.RestoreState(fl); err != nil {
		return fmt.Errorf("restoring the compression state: %w", err)
	}
	r.steps = st.step
	sp.step, sp.epoch, sp.consumed = st.step, st.epoch, st.consumed
	return nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
