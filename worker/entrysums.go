package worker

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// scriptSums is an entrypoint rank's streams to its job's summation
// shards (mode ps): the coordinator's, or the `gradsync aggregator`
// processes the assignment names, whose connections it owns.
type scriptSums struct {
	*paramserver.ScriptClient
	conns []*grpc.ClientConn // to aggregators; closed by leave and abort
}

// joinSums joins rank a.Rank to every shard of its job.
func joinSums(ctx context.Context, a *pb.Assignment, env *taskEnv) (*scriptSums, error) {
	spec := a.GetSpec()
	cfg := paramserver.ScriptConfig{JobID: a.JobId, Generation: a.Generation, Rank: int(a.Rank), World: int(a.WorldSize),
		Shards: int(spec.GetParameterServer().GetShards()), Where: []string{"the coordinator"}}
	s := &scriptSums{}
	conns := []grpc.ClientConnInterface{env.conn}
	if len(a.PsAddresses) > 0 {
		// The aggregators learn the job from the joins.
		cfg.Spec, cfg.Where, conns = spec, nil, nil
		for _, addr := range a.PsAddresses {
			conn, err := grpc.NewClient(addr, env.psDial...)
			if err != nil {
				s.closeConns()
				return nil, err
			}
			s.conns = append(s.conns, conn)
			conns = append(conns, conn)
			cfg.Where = append(cfg.Where, "aggregator "+addr)
		}
	}
	c, err := paramserver.DialScript(ctx, conns, cfg)
	if err != nil {
		s.closeConns()
		return nil, err
	}
	s.ScriptClient = c
	return s, nil
}

// leave leaves the shards in good order (the script is done), within 10 s.
func (s *scriptSums) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Close(ctx)
	s.closeConns()
}

// abort breaks the streams at once (this rank failed).
func (s *scriptSums) abort() {
	s.Abort()
	s.closeConns()
}

func (s *scriptSums) closeConns() {
	for _, c := range s.conns {
		_ = c.Close()
	}
}
