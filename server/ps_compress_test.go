package server_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// compressedPSSpec trains logreg (a 10×784 weight PowerSGD compresses)
// with 2 workers in ps mode.
func compressedPSSpec(c *pb.CompressionSpec) *pb.JobSpec {
	s := quickSpec(2)
	s.Mode = "ps"
	s.Seed = proto.Int64(4)
	s.Epochs = proto.Int32(1)
	s.Compression = c
	return s
}

// TestPSCompressedTraining: every compression scheme trains in ps mode
// with 2 workers to the accuracy of uncompressed ps, and the result
// reports the bytes pushed per step and the ratio.
func TestPSCompressedTraining(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	c := newCluster(t, server.Config{}, 2)
	for _, tc := range []struct {
		c        *pb.CompressionSpec
		minRatio float64
	}{
		{&pb.CompressionSpec{Type: "none"}, 1},
		{&pb.CompressionSpec{Type: "fp16"}, 2},
		{&pb.CompressionSpec{Type: "bf16"}, 2},
		{&pb.CompressionSpec{Type: "int8"}, 3.9},
		{&pb.CompressionSpec{Type: "topk", Ratio: 0.05}, 9},
		{&pb.CompressionSpec{Type: "powersgd", Rank: 2, StartIter: 3}, 3.5},
	} {
		job := c.submit(ctx, compressedPSSpec(tc.c))
		j := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
		if j.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("%s: %s", tc.c.Type, j.Message)
		}
		r := j.GetResult()
		t.Logf("%s: accuracy %.4f, %.0f → %.0f bytes per step (%.1f×)", tc.c.Type, r.GetTestAccuracy(), r.GetRawBytesPerStep(), r.GetSentBytesPerStep(), r.GetCompressionRatio())
		if r.GetTestAccuracy() < 0.8 {
			t.Errorf("%s: test accuracy %.3f", tc.c.Type, r.GetTestAccuracy())
		}
		if r.GetRawBytesPerStep() != 4*7850 || r.GetCompressionRatio() < tc.minRatio || r.GetSentBytesPerStep() <= 0 {
			t.Errorf("%s: %v raw, %v sent bytes per step, ratio %v; want 31400 raw, ratio ≥ %v", tc.c.Type,
				r.GetRawBytesPerStep(), r.GetSentBytesPerStep(), r.GetCompressionRatio(), tc.minRatio)
		}
	}
}

// TestPSCompressedResume: the ranks' compression state (error feedback,
// PowerSGD's warm-start Q) is part of a ps checkpoint, so a job resumed
// from one mid-way ends with the parameters of the undisturbed run, bit
// for bit.
func TestPSCompressedResume(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	c := newCluster(t, server.Config{}, 2)
	for _, cs := range []*pb.CompressionSpec{
		{Type: "topk", Ratio: 0.05},
		{Type: "powersgd", Rank: 2, StartIter: 3},
	} {
		spec := compressedPSSpec(cs)
		spec.Epochs = proto.Int32(2) // 62 steps: checkpoints after 20, 40 and 60
		spec.Checkpoint = &pb.CheckpointSpec{EverySteps: 20, Keep: 100}
		whole := c.submit(ctx, spec)
		if j := c.waitState(ctx, whole.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("%s: %s", cs.Type, j.Message)
		}
		dir := filepath.Join(whole.RunDir, "checkpoints")
		want, last, _, err := checkpoint.Latest(dir)
		if err != nil {
			t.Fatal(err)
		}
		step := want.Meta.Step
		mid, err := checkpoint.Load(filepath.Join(dir, "ckpt-20"))
		if err != nil {
			t.Fatal(err)
		}
		for r := range 2 {
			v, err := mid.Extra[compress.CheckpointOwn(r)].Float32s()
			if err != nil || !slices.ContainsFunc(v, func(x float32) bool { return x != 0 }) {
				t.Fatalf("%s: ckpt-20 holds no error feedback of rank %d (%v)", cs.Type, r, err)
			}
		}
		if _, ok := mid.Extra[compress.CheckpointShared]; ok != (cs.Type == "powersgd") {
			t.Errorf("%s: ckpt-20 has shared state: %v", cs.Type, ok)
		}
		// Keep ckpt-20 as the newest and resume from it.
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if n, err := strconv.Atoi(e.Name()[len("ckpt-"):]); err == nil && n > 20 {
				if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
		resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: whole.Id})
		if err != nil {
			t.Fatal(err)
		}
		if j := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
			t.Fatalf("%s resumed: %s", cs.Type, j.Message)
		}
		got, err := checkpoint.Load(filepath.Join(resp.Job.RunDir, "checkpoints", filepath.Base(last)))
		if err != nil {
			t.Fatalf("%s resumed: no checkpoint of step %d: %v", cs.Type, step, err)
		}
		if !slices.Equal(flatParams(t, spec, got), flatParams(t, spec, want)) {
			t.Errorf("%s: resumed from step 20, the parameters after step %d differ from the undisturbed run's", cs.Type, step)
		}
		for name, tw := range want.Extra {
			if !slices.Equal(got.Extra[name].Data, tw.Data) {
				t.Errorf("%s: compression state %s differs after the resume", cs.Type, name)
			}
		}
	}
}
