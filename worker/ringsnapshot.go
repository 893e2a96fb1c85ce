package worker

import (
	"fmt"
	"sync"
	"time"

	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// snapshot is one ring rank's training state after a completed step: what
// a new generation of the job needs to go on from there without a
// checkpoint. The buffers are allocated once and overwritten.
type snapshot struct {
	gen      uint64 // the generation that reached this state (or started from it)
	step     int64  // optimiser steps taken
	epoch    int    // the epoch in progress, and the leading positions of its
	consumed int64  // global order trained on (epoch+1, 0 at an epoch's end)

	params, bufs []float32
	// The optimiser's state: SGD's momentum buffer in optA, or Adam's
	// moments in optA and optB with adamT its step count. optSet is false
	// before the first step (or without momentum).
	optA, optB []float32
	optSet     bool
	adamT      int
	// red is the reducer's state: shared (PowerSGD's Q) and own (error
	// feedback).
	red compress.Flat
	// scaler is the loss scaler's state (precision fp16; scalerSet false
	// without a scaler): without it a new generation would start the
	// scale again at 2^16 and its steps would differ from an
	// uninterrupted run's.
	scaler    optim.ScalerState
	scalerSet bool
}

// jobSnapshots are the last two snapshots one worker took of one job.
// Two, not one: when a peer dies during the last all-gather of step s,
// some survivors have finished step s and others have not, and every one
// of them must still hold the state after step s−1 to agree on it.
//
// A jobSnapshots is used by one task at a time (a worker runs one task,
// and stops it before it starts the next), so it has no lock of its own.
type jobSnapshots struct {
	slots  [2]snapshot
	valid  [2]bool
	newest int // index of the newest valid slot
	// stage is the pipeline stage a pipeline rank's snapshots hold
	// (piperecover.go); 0 otherwise.
	stage int

	taken   int64         // snapshots taken since the worker got this job
	copying time.Duration // time spent copying them
}

// reset forgets every snapshot (the buffers are kept).
func (j *jobSnapshots) reset() { j.valid = [2]bool{} }

// latest returns the newest snapshot, or nil.
func (j *jobSnapshots) latest() *snapshot {
	if !j.valid[j.newest] {
		return nil
	}
	return &j.slots[j.newest]
}

// at returns the snapshot after step, or nil.
func (j *jobSnapshots) at(step int64) *snapshot {
	for i := range j.slots {
		if j.valid[i] && j.slots[i].step == step {
			return &j.slots[i]
		}
	}
	return nil
}

// older returns the step of the older snapshot, or -1.
func (j *jobSnapshots) olderStep() int64 {
	o := 1 - j.newest
	if !j.valid[o] {
		return -1
	}
	return j.slots[o].step
}

// take copies the state after a completed step into the older slot,
// which becomes the newest. The copies are plain memory copies into
// buffers allocated at the first snapshot. scaler is the loss scaler (nil
// without one).
func (j *jobSnapshots) take(gen uint64, step int64, epoch int, consumed int64, net *models.Network, opt optim.Stepper, red compress.Stateful, scaler *optim.LossScaler) {
	t0 := time.Now()
	i := 1 - j.newest
	if !j.valid[j.newest] {
		i = j.newest
	}
	s := &j.slots[i]
	s.gen, s.step, s.epoch, s.consumed = gen, step, epoch, consumed
	s.params = copyInto(s.params, net.Params())
	s.bufs = copyInto(s.bufs, net.Buffers())
	s.optSet, s.adamT = false, 0
	switch o := opt.(type) {
	case *optim.SGD:
		if buf := o.State(); buf != nil {
			s.optA, s.optSet = copyInto(s.optA, buf), true
		}
	case *optim.Adam:
		if m, v, t := o.State(); m != nil {
			s.optA, s.optB, s.adamT, s.optSet = copyInto(s.optA, m), copyInto(s.optB, v), t, true
		}
	}
	ns, no := red.FlatLen()
	s.red.Shared = resize(s.red.Shared, ns)
	s.red.Own = resize(s.red.Own, no)
	red.CopyState(&s.red)
	s.scaler, s.scalerSet = optim.ScalerState{}, scaler != nil
	if scaler != nil {
		s.scaler = scaler.State()
	}
	j.valid[i] = true
	j.newest = i
	j.taken++
	j.copying += time.Since(t0)
}

// restore loads s's model, optimiser and loss-scaler state into net, opt
// and scaler (nil: no scaler; a snapshot without a scaler's state leaves
// it as it is, as a checkpoint without one does). The reducer's state is
// restored separately: its own part is per rank.
func (s *snapshot) restore(net *models.Network, opt optim.Stepper, scaler *optim.LossScaler) error {
	if len(s.params) != len(net.Params()) || len(s.bufs) != len(net.Buffers()) {
		return fmt.Errorf("snapshot holds %d parameters and %d buffer values, the model %d and %d",
			len(s.params), len(s.bufs), len(net.Params()), len(net.Buffers()))
	}
	copy(net.Params(), s.params)
	copy(net.Buffers(), s.bufs)
	switch o := opt.(type) {
	case *optim.SGD:
		if !s.optSet {
			o.SetState(nil)
			break
		}
		if len(s.optA) != len(s.params) {
			return fmt.Errorf("snapshot holds a momentum buffer of %d values for %d parameters", len(s.optA), len(s.params))
		}
		o.SetState(s.optA)
	case *optim.Adam:
		if !s.optSet {
			o.SetState(nil, nil, 0)
			break
		}
		if len(s.optA) != len(s.params) || len(s.optB) != len(s.params) {
			return fmt.Errorf("snapshot holds Adam moments of %d and %d values for %d parameters", len(s.optA), len(s.optB), len(s.params))
		}
		o.SetState(s.optA, s.optB, s.adamT)
	}
	if scaler != nil && s.scalerSet {
		if err := scaler.Restore(s.scaler); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	return nil
}

// copyInto copies src into dst, reallocating dst only if its length
// differs.
func copyInto(dst, src []float32) []float32 {
	dst = resize(dst, len(src))
	copy(dst, src)
	return dst
}

func resize(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// snapshotStore is a worker's in-memory snapshots. They outlive the task
// that took them, so that a survivor reassigned to a new generation of
// the job starts from them; they are kept for one job only, the one the
// worker ran last, and dropped when that job ends (its task succeeds, or
// the coordinator cancels it for good) or the worker is given another job.
type snapshotStore struct {
	mu    sync.Mutex // guards jobID and snaps
	jobID string
	snaps *jobSnapshots
}

// forJob returns the snapshots of job, dropping those of any other job.
func (s *snapshotStore) forJob(job string) *jobSnapshots {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobID != job || s.snaps == nil {
		s.jobID, s.snaps = job, &jobSnapshots{}
	}
	return s.snaps
}

// drop forgets the snapshots of job (if they are the ones held).
func (s *snapshotStore) drop(job string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobID == job {
		s.jobID, s.snaps = "", nil
	}
}
