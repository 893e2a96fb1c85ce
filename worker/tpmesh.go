package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/internal/optim"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/tensorpar"
)

// meshGroup is what a label shard and a tensor rank share: their place
// on the mesh of D replicas of L (or T) ranks, the replica's group (a
// tensorpar.Group over a gRPC ring of its ranks, counted), the ring of
// the same rank of every replica (nil when D = 1), over which each step's
// gradients are averaged, and the optimiser step count.
type meshGroup struct {
	coord   labelCoord
	what    string // "label shard", "tensor rank": names this rank in errors
	spec    *pb.JobSpec
	log     *slog.Logger
	jobID   string
	timeout time.Duration
	total   int64
	steps   int64 // optimiser steps taken
	opt     aggregator.Options

	group                  *tensorpar.Counting
	groupRing, replicaRing *ringrpc.Ring
	promGroup, promReplica ringBytes
}

// joinMesh joins the replica's group ring (named groupName of the job
// and the replica) and, with D > 1, the ring of this rank's replicas
// (replicaName of the job and the rank in its replica). On error
// everything joined is left.
func joinMesh(ctx context.Context, a *pb.Assignment, env *taskEnv, c labelCoord, what, groupName, replicaName string, totalSteps int64) (_ *meshGroup, err error) {
	m := &meshGroup{coord: c, what: what, spec: a.Spec, log: env.log, jobID: a.JobId, total: totalSteps,
		timeout: time.Duration(a.Spec.GetStepTimeoutSeconds() * float64(time.Second)), opt: aggregator.Options{Generation: a.Generation}}
	if len(a.Peers) != int(a.WorldSize) {
		return nil, fmt.Errorf("%d peer addresses for %d ranks", len(a.Peers), a.WorldSize)
	}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	jctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	var peers []string
	for s := range c.shards {
		peers = append(peers, a.Peers[c.rank(c.replica, s)])
	}
	if m.groupRing, err = env.ring.Join(jctx, ringrpc.RingConfig{JobID: fmt.Sprintf(groupName, a.JobId, c.replica),
		Generation: a.Generation, Rank: c.shard, Peers: peers, DialOptions: env.peerDial}); err != nil {
		return nil, fmt.Errorf("joining replica %d's group: %w", c.replica, err)
	}
	rg, err := tensorpar.NewRingGroup(m.groupRing, uint32(1+c.replica), a.Generation, 0)
	if err != nil {
		return nil, err
	}
	m.group = &tensorpar.Counting{Group: rg}
	if c.replicas > 1 {
		peers = peers[:0]
		for d := range c.replicas {
			peers = append(peers, a.Peers[c.rank(d, c.shard)])
		}
		if m.replicaRing, err = env.ring.Join(jctx, ringrpc.RingConfig{JobID: fmt.Sprintf(replicaName, a.JobId, c.shard),
			Generation: a.Generation, Rank: c.replica, Peers: peers, DialOptions: env.peerDial}); err != nil {
			return nil, fmt.Errorf("joining %s %d's replica ring: %w", what, c.shard, err)
		}
	}
	return m, nil
}

// stepAll averages each of grads over the D replicas (one all-reduce
// each), checks them finite, and steps opts[i] on params[i] with them.
func (m *meshGroup) stepAll(ctx context.Context, params, grads [][]float32, opts []optim.Stepper) error {
	if m.replicaRing != nil {
		sctx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		for i, g := range grads {
			if err := aggregator.AllReduce(sctx, m.replicaRing, g, int64(len(grads))*m.steps+int64(i), m.opt); err != nil {
				return fmt.Errorf("all-reducing %s %d's gradients over its %d replicas: %w", m.what, m.coord.shard, m.coord.replicas, err)
			}
			inv := 1 / float32(m.coord.replicas)
			for j := range g {
				g[j] *= inv
			}
		}
	}
	for _, g := range grads {
		for _, v := range g {
			if v-v != 0 {
				return fmt.Errorf("%w at step %d on %s %d", aggregator.ErrNonFinite, m.steps, m.what, m.coord.shard)
			}
		}
	}
	lr := float32(optim.LearningRate(m.spec, m.steps, m.total))
	for i, o := range opts {
		o.SetLR(lr)
		o.Step(params[i], grads[i])
	}
	m.steps++
	return nil
}

// flushBytes reports the rings' traffic to the Prometheus counters.
func (m *meshGroup) flushBytes(env *taskEnv) {
	m.promGroup.flush(env, m.jobID, m.groupRing)
	m.promReplica.flush(env, m.jobID, m.replicaRing)
}

// close leaves the rings (each bounded by 10 s).
func (m *meshGroup) close() {
	for _, r := range []*ringrpc.Ring{m.replicaRing, m.groupRing} {
		if r == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.Shutdown(ctx); err != nil {
			m.log.Debug("leaving a model-parallel ring", "job", m.jobID, "err", err)
		}
		cancel()
	}
}

// wholeOptimizer is an optimiser of the job's kind whose state is
// parts, buffers over the whole model (one for SGD's momentum, Adam's m
// and v; none before a first step), with ref's step count (Adam): what
// a checkpoint captures under the whole model's names.
func wholeOptimizer(spec *pb.JobSpec, ref optim.Stepper, parts [][]float32) optim.Stepper {
	o := optim.FromSpec(spec)
	switch o := o.(type) {
	case *optim.SGD:
		if len(parts) > 0 {
			o.SetState(parts[0])
		}
	case *optim.Adam:
		_, _, steps := ref.(*optim.Adam).State()
		if len(parts) > 1 {
			o.SetState(parts[0], parts[1], steps)
		} else {
			o.SetState(nil, nil, steps)
		}
	}
	return o
}
