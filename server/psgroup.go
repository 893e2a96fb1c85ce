package server

import (
	"slices"
	"time"

	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// psGroup is the parameter server of a ps job's generation that the
// coordinator hosts: parameter_server.shards shards, each owning one
// range of the flat parameters (aggregator.Partition) behind its own
// lock, so the ranks' per-shard streams proceed in parallel.
type psGroup struct {
	shards []*psJob
}

// newPSGroup builds every shard of a job's generation (see newPSJob;
// checkpoints need a single shard).
func newPSGroup(env psEnv, jobID string, gen uint64, world int, net *models.Network, spec *pb.JobSpec, ckptDir, resumeFrom string) (*psGroup, error) {
	k := int(max(spec.GetParameterServer().GetShards(), 1))
	g := &psGroup{shards: make([]*psJob, k)}
	for i := range g.shards {
		p, err := newPSJob(env, jobID, gen, world, net, spec, i, ckptDir, resumeFrom)
		if err != nil {
			return nil, err
		}
		g.shards[i] = p
	}
	return g, nil
}

// abort stops every shard (see psJob.abort).
func (g *psGroup) abort(err error) {
	for _, p := range g.shards {
		p.abort(err)
	}
}

// saveStopped writes the checkpoint of a job that stops early; only a
// single-shard job has checkpoints (see psJob.saveStopped).
func (g *psGroup) saveStopped(now time.Time) (string, error) {
	if len(g.shards) != 1 {
		return "", nil
	}
	return g.shards[0].saveStopped(now)
}

// takeLag is rank's mean arrival lag per step (consistency sync) as shard
// 0 measured it: every shard sees a rank's pushes of a step together.
func (g *psGroup) takeLag(rank int) (float64, bool) {
	return g.shards[0].takeLag(rank)
}

// addPSStaleness adds a progress report's staleness figures to its
// metrics.jsonl record, for ps jobs with consistency async or bounded.
func addPSStaleness(rec map[string]any, spec *pb.JobSpec, p *pb.Progress) {
	if spec.GetMode() != "ps" || spec.GetParameterServer().GetConsistency() == jobspec.PSSync {
		return
	}
	rec["ps_stale_steps_mean"], rec["ps_stale_steps_max"] = p.PsStaleStepsMean, p.PsStaleStepsMax
	rec["ps_stale_updates_mean"], rec["ps_stale_updates_max"] = p.PsStaleUpdatesMean, p.PsStaleUpdatesMax
	rec["ps_wait_seconds"], rec["ps_refused"] = p.PsWaitSeconds, p.PsRefused
}

// anyJoined reports whether a rank has joined the shard.
func (p *psJob) anyJoined() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.joined, true)
}
