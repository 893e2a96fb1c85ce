package paramserver

import (
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Group is the parameter server of a ps job's generation that the
// coordinator hosts: parameter_server.shards shards, each owning one
// range of the flat parameters (aggregator.Partition) behind its own
// lock, so the ranks' per-shard streams proceed in parallel.
type Group struct {
	shards []*jobShard
}

// NewGroup builds every shard of a job's generation (see newJobShard;
// checkpoints need a single shard).
func NewGroup(env Env, jobID string, gen uint64, world int, net *models.Network, spec *pb.JobSpec, ckptDir, resumeFrom string) (*Group, error) {
	k := int(max(spec.GetParameterServer().GetShards(), 1))
	g := &Group{shards: make([]*jobShard, k)}
	for i := range g.shards {
		p, err := newJobShard(env, jobID, gen, world, net, spec, i, ckptDir, resumeFrom)
		if err != nil {
			return nil, err
		}
		g.shards[i] = p
	}
	return g, nil
}

// Abort stops every shard (see jobShard.abort).
func (g *Group) Abort(err error) {
	for _, p := range g.shards {
		p.abort(err)
	}
}

// SaveStopped writes the checkpoint of a job that stops early; only a
// single-shard job has checkpoints (see jobShard.saveStopped).
func (g *Group) SaveStopped(now time.Time) (string, error) {
	if len(g.shards) != 1 {
		return "", nil
	}
	return g.shards[0].saveStopped(now)
}

// TakeLag is rank's mean arrival lag per step (consistency sync) as shard
// 0 measured it: every shard sees a rank's pushes of a step together.
func (g *Group) TakeLag(rank int) (float64, bool) {
	p := g.shards[0]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lags.Take(rank)
}

// anyJoined reports whether a rank has joined the shard.
func (p *jobShard) anyJoined() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.joined, true)
}

// Serve serves one rank's Sync stream, opened by join (RecvJoin), to the
// shard the join names, until the rank closes it or the job stops.
func (g *Group) Serve(stream pb.ParameterServer_SyncServer, join *pb.SyncJoin) error {
	if join.Shard < 0 || int(join.Shard) >= len(g.shards) {
		return status.Errorf(codes.InvalidArgument, "shard %d out of range [0,%d)", join.Shard, len(g.shards))
	}
	return g.shards[join.Shard].serve(stream, join)
}

// Pull streams a snapshot of the job's parameters: each shard's range as
// it is when read (with consistency sync and several shards, they may be
// a step apart while a step is being applied), tagged with shard 0's
// step.
func (g *Group) Pull(stream pb.ParameterServer_PullServer) error {
	snap := make([]float32, g.shards[0].total)
	var step int64
	for i, p := range g.shards {
		p.mu.Lock()
		copy(snap[p.rng.Lo:p.rng.Hi], p.paramsLocked())
		if i == 0 {
			step = p.stepLocked()
		}
		p.mu.Unlock()
	}
	p := g.shards[0]
	var sp wire.Splitter
	return sp.Frames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step},
		snap, func(f *pb.TensorFrame) error { return stream.Send(&pb.PullResponse{Parameters: f}) })
}
