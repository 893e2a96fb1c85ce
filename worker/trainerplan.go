package worker

import "github.com/gradsync/gradsync/data"

// position is where training stands: step optimiser steps taken, in
// epoch (the epoch in progress) with the leading consumed positions of
// its global sample order trained on. The end of epoch e is {e+1, 0}.
type position struct {
	step     int64
	epoch    int
	consumed int64
}

// stepPlan is how a task's steps cover the training data: epochs of
// perEpoch steps of batch examples on each of world ranks, cut at
// maxSteps. Training that starts in the middle of an epoch — where a
// checkpoint or snapshot stopped, possibly with another world size —
// deals the rest of that epoch's order out again, so that no sample is
// lost or repeated. It is pure: the Trainer's decisions about where it
// is are made here.
type stepPlan struct {
	trainLen int   // examples in the training split
	world    int   // ranks
	batch    int   // examples per optimiser step on one rank
	perEpoch int   // steps in a whole epoch
	epochs   int   // epochs to train
	maxSteps int64 // 0: no limit
}

// epochStart returns how many positions of epoch's order were consumed
// before a task that starts at from trains it: from.consumed for the
// epoch it starts in, else 0.
func (p stepPlan) epochStart(epoch int, from position) int64 {
	if epoch == from.epoch && from.consumed > 0 {
		return from.consumed
	}
	return 0
}

// stepsIn returns the steps a task that starts at from takes in epoch.
func (p stepPlan) stepsIn(epoch int, from position) int {
	if c := p.epochStart(epoch, from); c > 0 {
		return data.ResumeSteps(p.trainLen, int(c), p.world, p.batch)
	}
	return p.perEpoch
}

// total returns the step count at which a task that starts at from
// ends.
func (p stepPlan) total(from position) int64 {
	total := from.step
	for e := from.epoch; e < p.epochs; e++ {
		total += int64(p.stepsIn(e, from))
	}
	if p.maxSteps > 0 && p.maxSteps < total {
		total = p.maxSteps
	}
	return total
}

// after returns the position reached by step (the count of steps taken,
// this one included), batch b of the nb of epoch, whose order was
// consumed up to start before it: the epoch's end after its last batch.
func (p stepPlan) after(step int64, epoch int, start int64, b, nb int) position {
	if b+1 == nb {
		return position{step: step, epoch: epoch + 1}
	}
	return position{step: step, epoch: epoch, consumed: min(start+int64((b+1)*p.batch*p.world), int64(p.trainLen))}
}
