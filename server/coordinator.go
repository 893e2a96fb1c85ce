package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// outboxSize bounds the messages queued for one worker. The coordinator
// sends few (assignments, cancellations); a worker that lets this many pile
// up is not reading and is dropped.
const outboxSize = 64

// conn is the stream of a connected worker: its outbox, drained by the
// Connect call's sender goroutine, and how to end it. What the worker is
// and does (state, job, last heartbeat) is the core's registry; conn is
// only the way to reach it. Server.conns maps a worker id to its latest
// connection.
type conn struct {
	id        string
	out       chan *pb.ConnectResponse
	stop      context.CancelFunc
	closeOnce *sync.Once
}

// send queues a message for the worker without blocking; a full outbox
// closes the connection (the worker is then lost). It runs as an effect,
// off the server's lock.
func (c *conn) send(m *pb.ConnectResponse) {
	select {
	case c.out <- m:
	default:
		c.close()
	}
}

func (c *conn) close() { c.closeOnce.Do(c.stop) }

// sendLocked queues m for worker id's current connection, as an effect
// carried out after the lock is released, in order with the others.
func (s *Server) sendLocked(id string, m *pb.ConnectResponse) {
	c := s.conns[id]
	if c == nil {
		return
	}
	s.mu.later(func() {
		s.mu.offLock("a send to a worker")
		c.send(m)
	})
}

// Connect serves one worker's control stream: the hello, then heartbeats,
// progress, evaluations and results; assignments and cancellations go the
// other way through one sender goroutine.
func (s *Server) Connect(stream pb.Coordinator_ConnectServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message on Connect must be a hello")
	}
	if len(hello.Address) == 0 || len(hello.Address) > 512 {
		return status.Error(codes.InvalidArgument, "hello.address must be the worker's host:port (1..512 bytes)")
	}
	if len(hello.WorkerId) > 128 || len(hello.Name) > 256 {
		return status.Error(codes.InvalidArgument, "hello.worker_id is at most 128 bytes and hello.name at most 256")
	}
	id := hello.WorkerId
	if id == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		id = "w-" + hex.EncodeToString(b[:])
	}
	name := hello.Name
	if name == "" {
		name = id
		if p, ok := peer.FromContext(ctx); ok {
			name = p.Addr.String()
		}
	}
	c := &conn{id: id, out: make(chan *pb.ConnectResponse, outboxSize), stop: cancel, closeOnce: &sync.Once{}}
	if hello.GetMemoryBytes() > 0 {
		s.memoryOffered.Store(true)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "server is shutting down")
	}
	// The core answers with a Welcome (sent through c), then places the
	// jobs that were waiting for a worker.
	old := s.conns[id]
	s.conns[id] = c
	if err := s.stepLocked(coordinator.Hello{At: s.cfg.Now(), Worker: id, Name: name, Address: hello.Address, Resources: hello.Resources,
		Memory: hello.GetMemoryBytes()}); err != nil {
		s.conns[id] = old
		s.mu.Unlock()
		return status.Error(codes.AlreadyExists, err.Error())
	}
	s.log.Info("worker connected", "worker", id, "name", name, "address", hello.Address,
		"cpu_cores", hello.GetResources().GetCpuCores(), "gpus", len(hello.GetResources().GetGpus()))
	// Not waiting for the effects (a job placed now is being prepared):
	// the stream reads the worker's heartbeats meanwhile.
	s.mu.unlockAsync()

	// The sender goroutine is owned by this call: it ends when ctx does, and
	// Connect waits for it before returning.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-c.out:
				if err := stream.Send(m); err != nil {
					cancel()
					return
				}
			}
		}
	}()
	recvErr := make(chan error, 1)
	// The receive loop runs beside the handler so that the handler can end
	// the stream (lost heartbeat, shutdown) while Recv blocks; Recv returns
	// as soon as the handler does. Serve waits for it through s.streams.
	s.streams.Add(1)
	go func() {
		defer s.streams.Done()
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				cancel()
				return
			}
			s.handleWorkerMessage(c, m)
		}
	}()
	<-ctx.Done()
	reason := "connection closed"
	select {
	case err := <-recvErr:
		if err != io.EOF {
			reason = fmt.Sprintf("its connection broke (%v)", status.Convert(err).Message())
		}
	default:
		if stream.Context().Err() == nil {
			reason = "disconnected by the coordinator"
		}
	}
	s.mu.Lock()
	if s.conns[id] == c { // not replaced by a later connection of the same id
		s.mustStepLocked(coordinator.Disconnected{At: s.cfg.Now(), Worker: id, Reason: reason})
	}
	s.mu.Unlock()
	cancel()
	wg.Wait()
	return status.Error(codes.Unavailable, "worker "+id+": "+reason)
}

// workerLostLocked carries out the core's WorkerLost: it is counted and
// logged, and a real federated client is only missing from its rounds
// (the round driver's business). Whether the job it held fails or
// recovers the core decides (the actions that follow).
func (s *Server) workerLostLocked(a coordinator.WorkerLost) {
	if a.Timeout {
		s.cfg.Metrics.HeartbeatMissed()
	}
	if s.closed {
		s.log.Debug("worker disconnected at shutdown", "worker", a.Worker)
		return
	}
	s.log.Warn("worker lost", "worker", a.Worker, "address", a.Address, "reason", a.Reason)
	e := s.jobs[a.Job]
	if e == nil || e.final() {
		return
	}
	if e.fed != nil { // a real federated client: missing from its rounds, not a failure
		e.fed.workerLostLocked(a.Worker, a.Reason)
		return
	}
	// Otherwise the core fails or recovers the job (the actions after
	// this one).
}

// handleWorkerMessage applies one message from a worker's stream.
func (s *Server) handleWorkerMessage(c *conn, m *pb.ConnectRequest) {
	s.mu.Lock()
	// Effects run in order without the stream waiting for them: it
	// keeps reading (heartbeats) while a long one runs.
	defer s.mu.unlockAsync()
	now := s.cfg.Now()
	id := c.id
	if s.conns[id] == c {
		s.mustStepLocked(coordinator.Heard{At: now, Worker: id})
	}
	switch m := m.Msg.(type) {
	case *pb.ConnectRequest_Heartbeat:
	case *pb.ConnectRequest_Progress:
		e := s.runningJobLocked(id, m.Progress.GetJobId(), m.Progress.GetRank())
		if e == nil || m.Progress.Progress == nil {
			return
		}
		if m.Progress.Generation != e.job.Generation {
			return // from a generation the job has left behind
		}
		p := m.Progress.Progress
		r := m.Progress.Rank
		e.rankIPS[r] = p.ImagesPerSecond
		s.cfg.Metrics.SetImagesPerSecond(e.job.Id, int(r), p.ImagesPerSecond)
		e.job.Ranks[r] = proto.Clone(p).(*pb.Progress)
		{
			rec := map[string]any{"kind": "progress", "time": now.UTC().Format(time.RFC3339Nano), "rank": r,
				"epoch": p.Epoch, "step": p.Step, "total_steps": p.TotalSteps, "loss": p.Loss,
				"images_per_second": p.ImagesPerSecond, "learning_rate": p.LearningRate, "elapsed_seconds": p.ElapsedSeconds,
				"sent_bytes_per_step": p.SentBytesPerStep, "compression_ratio": p.CompressionRatio,
				"compute_seconds": p.ComputeSeconds, "left_wait_seconds": p.LeftWaitSeconds}
			addPSStaleness(rec, e.job.Spec, p)
			if p.PipelineStages > 0 { // a pipeline stage's figures over its task so far
				rec["pipeline_stage"], rec["pipeline_replica"], rec["stage_step_seconds"] = p.PipelineStage, p.PipelineReplica, p.StageStepSeconds
				rec["stage_idle_fraction"], rec["stage_peak_in_flight"], rec["stage_peak_activation_bytes"] = p.StageIdleFraction, p.StagePeakInFlight, p.StagePeakActivationBytes
			}
			if e.job.Spec.GetPrecision() == "fp16" { // the loss scaler's figures, 0 skipped included
				rec["skipped_steps"], rec["loss_scale"] = p.SkippedSteps, p.LossScale
			}
			s.runLogLocked(e, rec)
		}
		s.stepProgressLocked(e, id, int(r), p, now)
		if r != 0 {
			return
		}
		var total float64
		for _, v := range e.rankIPS {
			total += v
		}
		jp := proto.Clone(p).(*pb.Progress)
		jp.ImagesPerSecond = total
		e.job.Progress = jp
		s.emitLocked(e, pb.EventKind_EVENT_KIND_PROGRESS, "", nil)
	case *pb.ConnectRequest_Started:
		st := m.Started
		if err := s.stepLocked(coordinator.Started{At: now, Worker: id, Job: st.GetJobId(), Rank: int(st.GetRank()), Task: st}); err != nil {
			s.log.Warn("worker reported on a rank it does not hold", "worker", id, "job", st.GetJobId(), "rank", st.GetRank())
		}
	case *pb.ConnectRequest_Eval:
		ev := m.Eval
		e := s.runningJobLocked(id, ev.GetJobId(), ev.GetRank())
		if e == nil || ev.Generation != e.job.Generation {
			return
		}
		s.recordEvalLocked(e, ev, now)
	case *pb.ConnectRequest_Done:
		// The core decides: a task of an ended job stopped, a rank
		// finished (the job may be done) or failed.
		d := m.Done
		err := s.stepLocked(coordinator.TaskDone{At: now, Worker: id, Job: d.GetJobId(), Generation: d.GetGeneration(), Rank: int(d.GetRank()),
			Error: d.GetError(), Result: d.GetResult(), Links: d.GetRingLinks(), CommandFailed: d.GetCommandFailed()})
		if err != nil {
			s.log.Warn("worker reported on a rank it does not hold", "worker", id, "job", d.GetJobId(), "rank", d.GetRank())
		}
	}
}

// recordEvalLocked records an evaluation of a running job: metrics.jsonl
// (with the round's participants for fedavg), the charts, and an event.
func (s *Server) recordEvalLocked(e *jobEntry, ev *pb.TaskEval, now time.Time) {
	e.lastEval = ev
	{
		rec := map[string]any{"kind": "eval", "time": now.UTC().Format(time.RFC3339Nano),
			"epoch": ev.Epoch, "step": ev.Step, "test_accuracy": ev.TestAccuracy, "test_loss": ev.TestLoss, "train_loss": ev.TrainLoss}
		if ev.MicroF1 != 0 || ev.MeanAveragePrecision != 0 { // multi-label
			rec["micro_f1"], rec["macro_f1"], rec["mean_average_precision"] = ev.MicroF1, ev.MacroF1, ev.MeanAveragePrecision
		}
		if r := ev.Round; r != nil { // fedavg: the round's participants and what they held
			hists := make([][]int32, len(r.LabelHistograms))
			for i, h := range r.LabelHistograms {
				hists[i] = h.Counts
			}
			delete(rec, "epoch")
			rec["round"], rec["participants"], rec["missing"] = r.Round, r.Participants, r.Missing
			rec["update_norm"], rec["label_histograms"] = r.UpdateNorm, hists
		}
		s.runLogLocked(e, rec)
	}
	// Redraw once the record is written (after the lock is released).
	dir := e.job.RunDir
	s.mu.later(func() {
		s.mu.within(func() { s.replotLocked(dir) })
	})
	what := "epoch"
	if ev.Round != nil {
		what = "round"
	}
	s.emitLocked(e, pb.EventKind_EVENT_KIND_EVAL, fmt.Sprintf("%s %d: test accuracy %.2f%%", what, ev.Epoch, 100*ev.TestAccuracy),
		func(r *pb.WatchJobResponse) {
			r.TestAccuracy, r.TestLoss, r.Epoch = ev.TestAccuracy, ev.TestLoss, ev.Epoch
		})
}

// runningJobLocked returns the running job a worker reports on, or nil when
// the report is late (the job ended) or does not come from the right rank.
func (s *Server) runningJobLocked(workerID, jobID string, rank int32) *jobEntry {
	e := s.jobs[jobID]
	if e == nil || e.job.State != pb.JobState_JOB_STATE_RUNNING {
		return nil
	}
	if rank < 0 || int(rank) >= len(e.job.WorkerIds) || e.job.WorkerIds[rank] != workerID {
		s.log.Warn("worker reported on a rank it does not hold", "worker", workerID, "job", jobID, "rank", rank)
		return nil
	}
	return e
}
