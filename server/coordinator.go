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

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// outboxSize bounds the messages queued for one worker. The coordinator
// sends few (assignments, cancellations); a worker that lets this many pile
// up is not reading and is dropped.
const outboxSize = 64

// workerEntry is a connected (or lost) worker. info and lastSeen are guarded
// by Server.mu; out and stop belong to the Connect call serving it.
type workerEntry struct {
	info      *pb.Worker
	connected time.Time
	lastSeen  time.Time
	out       chan *pb.ConnectResponse
	stop      context.CancelFunc
	closeOnce *sync.Once
}

// send queues a message for the worker without blocking; a full outbox
// closes the connection (the worker is then lost).
func (w *workerEntry) send(m *pb.ConnectResponse) {
	select {
	case w.out <- m:
	default:
		w.close()
	}
}

func (w *workerEntry) close() { w.closeOnce.Do(w.stop) }

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
	now := s.cfg.Now()
	w := &workerEntry{
		info: &pb.Worker{Id: id, Name: name, Address: hello.Address, Resources: hello.Resources,
			State: pb.WorkerState_WORKER_STATE_IDLE, LastHeartbeat: tsNow(now), ConnectedAt: tsNow(now)},
		connected: now, lastSeen: now, out: make(chan *pb.ConnectResponse, outboxSize),
		stop: cancel, closeOnce: &sync.Once{},
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "server is shutting down")
	}
	if old := s.workers[id]; old != nil && old.info.State != pb.WorkerState_WORKER_STATE_LOST {
		s.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "worker id %q is already connected from %s", id, old.info.Address)
	}
	s.workers[id] = w
	w.send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Welcome{Welcome: &pb.Welcome{
		WorkerId: id, HeartbeatIntervalSeconds: s.cfg.HeartbeatInterval.Seconds()}}})
	s.log.Info("worker connected", "worker", id, "name", name, "address", hello.Address,
		"cpu_cores", hello.GetResources().GetCpuCores(), "gpus", len(hello.GetResources().GetGpus()))
	s.scheduleLocked()
	s.mu.Unlock()

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
			case m := <-w.out:
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
			s.handleWorkerMessage(w, m)
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
	s.loseWorkerLocked(w, reason)
	s.mu.Unlock()
	cancel()
	wg.Wait()
	return status.Error(codes.Unavailable, "worker "+id+": "+reason)
}

// loseWorkerLocked marks a worker lost and fails the job it was running,
// naming it.
func (s *Server) loseWorkerLocked(w *workerEntry, reason string) {
	if w.info.State == pb.WorkerState_WORKER_STATE_LOST {
		return
	}
	w.info.State = pb.WorkerState_WORKER_STATE_LOST
	w.close()
	for _, e := range s.jobs { // an ended job waits no more for its task
		e.taskStoppedLocked(w.info.Id)
	}
	if s.closed {
		s.log.Debug("worker disconnected at shutdown", "worker", w.info.Id)
	} else {
		s.log.Warn("worker lost", "worker", w.info.Id, "address", w.info.Address, "reason", reason)
	}
	if jobID := w.info.JobId; jobID != "" && !s.closed {
		w.info.JobId = ""
		if e := s.jobs[jobID]; e != nil && !e.final() {
			if e.fed != nil { // a real federated client: missing from its rounds, not a failure
				e.fed.workerLostLocked(w, reason)
				return
			}
			rank := -1
			for r, id := range e.job.WorkerIds {
				if id == w.info.Id {
					rank = r
				}
			}
			msg := fmt.Sprintf("worker %s (rank %d, %s) lost: %s", w.info.Id, rank, w.info.Address, reason)
			if s.recoverLocked(e, w, reason, msg) {
				return
			}
			s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, msg)
		}
	}
}

// handleWorkerMessage applies one message from a worker's stream.
func (s *Server) handleWorkerMessage(w *workerEntry, m *pb.ConnectRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	w.lastSeen = now
	w.info.LastHeartbeat = tsNow(now)
	switch m := m.Msg.(type) {
	case *pb.ConnectRequest_Heartbeat:
	case *pb.ConnectRequest_Progress:
		e := s.runningJobLocked(w, m.Progress.GetJobId(), m.Progress.GetRank())
		if e == nil || m.Progress.Progress == nil {
			return
		}
		if m.Progress.Generation != e.job.Generation {
			return // from a generation the job has left behind
		}
		p := m.Progress.Progress
		r := m.Progress.Rank
		if out, ended := e.recovery.Progressed(now, e.job.Generation, len(e.job.WorkerIds)); ended {
			s.runLogLocked(e, out.Record)
			s.log.Info("job recovered", "job", e.job.Id, "seconds", out.Seconds, "generation", e.job.Generation)
			s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, out.Message, nil)
		}
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
			if e.job.Spec.GetPrecision() == "fp16" { // the loss scaler's figures, 0 skipped included
				rec["skipped_steps"], rec["loss_scale"] = p.SkippedSteps, p.LossScale
			}
			s.runLogLocked(e, rec)
		}
		s.noteDelayLocked(e, int(r), p, now)
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
		s.taskStartedLocked(w, m.Started)
	case *pb.ConnectRequest_Eval:
		ev := m.Eval
		e := s.runningJobLocked(w, ev.GetJobId(), ev.GetRank())
		if e == nil || ev.Generation != e.job.Generation {
			return
		}
		s.recordEvalLocked(e, ev, now)
	case *pb.ConnectRequest_Done:
		d := m.Done
		if e := s.jobs[d.GetJobId()]; e != nil && e.final() {
			if d.Generation == e.stopGen {
				e.taskStoppedLocked(w.info.Id)
			}
			return
		}
		if s.closed {
			return // the job stays RUNNING in the store; the next start decides
		}
		if e := s.jobs[d.GetJobId()]; e != nil && d.Generation != e.job.Generation {
			return // a task of a generation left behind (it was told to stop)
		}
		e := s.runningJobLocked(w, d.GetJobId(), d.GetRank())
		if e == nil || d.Generation != e.job.Generation {
			return
		}
		if d.Error != "" {
			if e.failed == nil {
				e.failed = map[string]bool{}
			}
			e.failed[w.info.Id] = true // its task is over: nothing to stop
			msg := fmt.Sprintf("rank %d (worker %s): %s", d.Rank, w.info.Id, d.Error)
			if e.job.Spec.GetMode() == "ring" {
				if s.ringFailedLocked(e, d) {
					return // the frame counts named the rank cut off
				}
				// A broken ring is usually a lost peer, which the
				// coordinator sees a moment later: it then names the lost
				// worker (or, for an elastic job, recovers). Fail with the
				// rank's own error only if nothing else happens within the
				// heartbeat timeout.
				e.recovery.RankFailed(now, e.job.Generation, msg, s.cfg.HeartbeatTimeout)
				return
			}
			s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, msg)
			return
		}
		e.ranksDone[d.Rank] = true
		e.results[d.Rank] = d.Result
		w.info.JobId = ""
		w.info.State = pb.WorkerState_WORKER_STATE_IDLE
		for _, ok := range e.ranksDone {
			if !ok {
				s.scheduleLocked()
				return
			}
		}
		res := e.results[0]
		if res == nil {
			res = &pb.JobResult{}
		}
		var ips float64
		for _, r := range e.results {
			ips += r.GetImagesPerSecond()
		}
		res.ImagesPerSecond = ips
		e.job.Result = res
		unit := "epoch(s)"
		if e.job.Spec.GetMode() == "fedavg" {
			unit = "round(s)"
		}
		s.endJobLocked(e, pb.JobState_JOB_STATE_SUCCEEDED,
			fmt.Sprintf("test accuracy %.2f%% after %d %s", 100*res.TestAccuracy, res.Epochs, unit))
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
		s.mu.Lock()
		s.replotLocked(dir)
		s.mu.Unlock()
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
func (s *Server) runningJobLocked(w *workerEntry, jobID string, rank int32) *jobEntry {
	e := s.jobs[jobID]
	if e == nil || e.job.State != pb.JobState_JOB_STATE_RUNNING {
		return nil
	}
	if rank < 0 || int(rank) >= len(e.job.WorkerIds) || e.job.WorkerIds[rank] != w.info.Id {
		s.log.Warn("worker reported on a rank it does not hold", "worker", w.info.Id, "job", jobID, "rank", rank)
		return nil
	}
	return e
}
