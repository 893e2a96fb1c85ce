package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// peerServer is one in-process worker's peer endpoint: the Collective and
// Pipeline services on a loopback gRPC server.
type peerServer struct {
	addr string
	ring *ringrpc.Endpoint
	pipe *peerrpc.Endpoint
}

// peerServers starts n peer endpoints, stopped at the test's end.
func peerServers(t *testing.T, n int) []*peerServer {
	t.Helper()
	var out []*peerServer
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(ringrpc.ServerOptions()...)
		p := &peerServer{addr: lis.Addr().String(), ring: ringrpc.NewEndpoint(nil), pipe: peerrpc.NewEndpoint()}
		pb.RegisterCollectiveServer(gs, p.ring)
		pb.RegisterPipelineServer(gs, p.pipe)
		done := make(chan struct{})
		go func() { // owned by the test: stopped by its cleanup
			defer close(done)
			_ = gs.Serve(lis)
		}()
		t.Cleanup(func() {
			p.pipe.Close()
			p.ring.Close()
			gs.Stop()
			<-done
		})
		out = append(out, p)
	}
	return out
}

// runJob runs every rank of spec's job in this process, each over its own
// peer endpoint, and returns the ranks' results.
func runJob(t *testing.T, spec *pb.JobSpec, runsDir string, edit ...func(*pb.Assignment)) []*pb.JobResult {
	t.Helper()
	res, _ := runJobReports(t, spec, runsDir, edit...)
	return res
}

// runJobReports is runJob that also returns what each rank sent the
// coordinator, by rank.
func runJobReports(t *testing.T, spec *pb.JobSpec, runsDir string, edit ...func(*pb.Assignment)) ([]*pb.JobResult, [][]*pb.ConnectRequest) {
	t.Helper()
	n := int(spec.GetWorkers())
	servers := peerServers(t, n)
	var peers []string
	for _, s := range servers {
		peers = append(peers, s.addr)
	}
	net, err := models.New(spec.Model, models.Options{Seed: spec.GetSeed()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := make([]*pb.JobResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	outs := make([]chan *pb.ConnectRequest, n)
	for r := range n {
		outs[r] = make(chan *pb.ConnectRequest, 10000)
		env := &taskEnv{rep: &reporter{ctx: ctx, out: outs[r]},
			log: slog.New(slog.NewTextHandler(io.Discard, nil)), ring: servers[r].ring, pipe: servers[r].pipe,
			peerDial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, runsDir: runsDir}
		a := &pb.Assignment{JobId: "job-p", Generation: 1, Rank: int32(r), WorldSize: int32(n), Spec: spec, Peers: peers,
			NumParams: int64(net.NumParams())}
		for _, e := range edit {
			e(a)
		}
		wg.Go(func() { res[r], errs[r] = runAssignment(ctx, a, env) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	sent := make([][]*pb.ConnectRequest, n)
	for r, out := range outs {
		for len(out) > 0 {
			sent[r] = append(sent[r], <-out)
		}
	}
	return res, sent
}

func normalized(t *testing.T, in *pb.JobSpec) *pb.JobSpec {
	t.Helper()
	s, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPipelineTrainerMatchesGradAccum trains lenet5 through the Trainer
// on 2 stages (gpipe) and on 2 replicas × 2 stages (1f1b), every rank
// in this process over real loopback gRPC, and checks every rank's
// result against whole-model ring ranks accumulating the same 4
// micro-batches: the same checksum of the whole model, bit for bit, and
// the same accuracy; each stage's summary file says what it held.
func TestPipelineTrainerMatchesGradAccum(t *testing.T) {
	base := func(workers, batch, accum int32) *pb.JobSpec {
		return &pb.JobSpec{Model: "lenet5", Mode: "ring", Workers: proto.Int32(workers), BatchSize: proto.Int32(batch),
			GradAccumSteps: accum, MaxSteps: 12, Seed: proto.Int64(4), LogEverySteps: 5,
			Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 800, SyntheticTest: 200}}
	}
	for _, tc := range []struct {
		replicas int32
		schedule string
	}{{1, "gpipe"}, {2, "1f1b"}} {
		want := runJob(t, normalized(t, base(tc.replicas, 8, 4)), "")
		spec := base(2*tc.replicas, 32, 1)
		spec.Parallelism = &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: 2, MicroBatches: 4, Schedule: tc.schedule}}
		runs := t.TempDir()
		got, sent := runJobReports(t, normalized(t, spec), runs)
		for r, g := range got {
			if g.ParameterChecksum != want[0].ParameterChecksum || g.Steps != want[0].Steps {
				t.Errorf("D=%d %s rank %d: checksum %x after %d steps; whole-model ring %x after %d", tc.replicas, tc.schedule, r,
					g.ParameterChecksum, g.Steps, want[0].ParameterChecksum, want[0].Steps)
			}
		}
		// Evaluated through the stages, the figures are the whole
		// model's evaluation's, bit for bit.
		sameEvaluation(t, fmt.Sprintf("D=%d %s", tc.replicas, tc.schedule), got[0], want[0])
		whole, err := models.New("lenet5", models.Options{Seed: 4})
		if err != nil {
			t.Fatal(err)
		}
		cut, err := models.Partition(whole, 2, models.Balance{})
		if err != nil {
			t.Fatal(err)
		}
		for r := range got {
			b, err := os.ReadFile(filepath.Join(runs, "job-p", fmt.Sprintf("pipeline-rank-%d.json", r)))
			if err != nil {
				t.Fatal(err)
			}
			var sum stageSummary
			if err := json.Unmarshal(b, &sum); err != nil {
				t.Fatal(err)
			}
			wantPeak := 4 // GPipe holds M; 1F1B min(M, S−s)
			if tc.schedule == "1f1b" {
				wantPeak = min(4, 2-sum.Stage)
			}
			if sum.Rank != r || sum.Stage != r%2 || sum.Replica != r/2 || sum.Steps != 12 || sum.PeakInFlight != wantPeak ||
				!(sum.IdleFraction >= 0 && sum.IdleFraction < 1) || sum.ExpectedBubble != 1.0/5 {
				t.Errorf("D=%d %s rank %d: summary %+v", tc.replicas, tc.schedule, r, sum)
			}
			// Its last progress report carries the stage's figures.
			var last *pb.Progress
			for _, m := range sent[r] {
				if p := m.GetProgress().GetProgress(); p != nil {
					last = p
				}
			}
			if last == nil || last.Step != 12 || last.PipelineStages != 2 || int(last.PipelineStage) != sum.Stage || int(last.PipelineReplica) != sum.Replica ||
				int(last.StagePeakInFlight) != wantPeak || last.StagePeakActivationBytes != sum.PeakActivationBytes || last.StagePeakActivationBytes <= 0 ||
				!(last.StageStepSeconds > 0) || last.StageIdleFraction != sum.IdleFraction {
				t.Errorf("D=%d %s rank %d: last progress %v; want the stage's figures (summary %+v)", tc.replicas, tc.schedule, r, last, sum)
			}
			// The stage's worker held its stage alone (counted), plus
			// one scratch tensor no larger than the largest tensor.
			st := cut[sum.Stage]
			if sum.ParamsHeld != st.ParamLen || sum.BufferValuesHeld != st.BufferLen || sum.ParamsHeld >= whole.NumParams() ||
				sum.ScratchValues > largestTensor(whole) {
				t.Errorf("D=%d %s rank %d (stage %d): held %d parameters, %d buffer values, %d scratch; the stage has %d and %d of %d, largest tensor %d",
					tc.replicas, tc.schedule, r, sum.Stage, sum.ParamsHeld, sum.BufferValuesHeld, sum.ScratchValues,
					st.ParamLen, st.BufferLen, whole.NumParams(), largestTensor(whole))
			}
		}
	}
}

// TestPipelineResumesOnAnotherCut checkpoints a 2-stage job halfway and
// resumes it on 4 stages: the checkpoint holds the whole model and
// optimiser, so the resumed job ends with the parameters, bit for bit,
// of the 2-stage job that never stopped.
func TestPipelineResumesOnAnotherCut(t *testing.T) {
	spec := func(stages int32) *pb.JobSpec {
		return normalized(t, &pb.JobSpec{Model: "lenet5", Workers: proto.Int32(stages), BatchSize: proto.Int32(16), MaxSteps: 12,
			Seed: proto.Int64(2), Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 800, SyntheticTest: 200},
			Checkpoint:  &pb.CheckpointSpec{EverySteps: 6},
			Parallelism: &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: stages, MicroBatches: 4}}})
	}
	dir := t.TempDir()
	whole := runJob(t, spec(2), "", func(a *pb.Assignment) { a.CheckpointDir = dir })
	runs := t.TempDir()
	resumed := runJob(t, spec(4), runs, func(a *pb.Assignment) { a.ResumeFrom = filepath.Join(dir, "ckpt-6") })
	for r, g := range resumed {
		if g.ParameterChecksum != whole[0].ParameterChecksum || g.Steps != 12 {
			t.Errorf("rank %d of 4 stages resumed at step 6: checksum %x after %d steps; the 2-stage job's %x after %d",
				r, g.ParameterChecksum, g.Steps, whole[0].ParameterChecksum, whole[0].Steps)
		}
		// The same bits from scratch would need 12 steps: it trained 6.
		b, err := os.ReadFile(filepath.Join(runs, "job-p", fmt.Sprintf("pipeline-rank-%d.json", r)))
		if err != nil {
			t.Fatal(err)
		}
		var sum stageSummary
		if err := json.Unmarshal(b, &sum); err != nil || sum.Steps != 6 || sum.Stages != 4 {
			t.Errorf("rank %d resumed: summary %+v (%v); want 6 steps on 4 stages", r, sum, err)
		}
	}
}

// largestTensor is the length of net's largest parameter or buffer.
func largestTensor(net *models.Network) int {
	n := 0
	for _, g := range append(append([]models.Segment(nil), net.Segments()...), net.BufferSegments()...) {
		n = max(n, g.Len)
	}
	return n
}

// sameEvaluation checks that got's evaluation figures are want's, bit
// for bit: accuracy, loss, per-class accuracy and confusion matrix.
func sameEvaluation(t *testing.T, what string, got, want *pb.JobResult) {
	t.Helper()
	if len(want.ConfusionMatrix) == 0 || want.TestLoss == 0 {
		t.Fatalf("%s: the whole-model run has no evaluation to compare with: %v", what, want)
	}
	if got.TestAccuracy != want.TestAccuracy || math.Float64bits(got.TestLoss) != math.Float64bits(want.TestLoss) ||
		!slices.Equal(got.ClassAccuracy, want.ClassAccuracy) || !slices.Equal(got.ConfusionMatrix, want.ConfusionMatrix) {
		t.Errorf("%s: evaluation through the pipeline: accuracy %v, loss %v, per class %v, confusion %v; whole model: %v, %v, %v, %v",
			what, got.TestAccuracy, got.TestLoss, got.ClassAccuracy, got.ConfusionMatrix,
			want.TestAccuracy, want.TestLoss, want.ClassAccuracy, want.ConfusionMatrix)
	}
}

// TestPipelineEvaluationMatchesWholeModel evaluates resnet8 (batch norm
// in evaluation mode) cut into 3 stages, each holding its stage alone,
// through the pipeline in micro-batches of 4 (the test split's 203
// examples end in a short one): accuracy, loss, per-class accuracy and
// confusion matrix are those of whole-model ring ranks accumulating the
// same micro-batches, bit for bit, as is the parameters' checksum.
func TestPipelineEvaluationMatchesWholeModel(t *testing.T) {
	base := func(workers, batch, accum int32) *pb.JobSpec {
		return &pb.JobSpec{Model: "resnet8", Mode: "ring", Workers: proto.Int32(workers), BatchSize: proto.Int32(batch),
			GradAccumSteps: accum, MaxSteps: 3, Seed: proto.Int64(9), LogEverySteps: 5,
			Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 120, SyntheticTest: 203}}
	}
	want := runJob(t, normalized(t, base(1, 4, 3)), "")
	spec := base(3, 12, 1)
	spec.Parallelism = &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: 3, MicroBatches: 3, Schedule: "1f1b"}}
	got := runJob(t, normalized(t, spec), "")
	sameEvaluation(t, "resnet8 S=3 M=3", got[0], want[0])
	for r, g := range got {
		if g.ParameterChecksum != want[0].ParameterChecksum {
			t.Errorf("rank %d: checksum %x, whole-model %x", r, g.ParameterChecksum, want[0].ParameterChecksum)
		}
	}
}
