package worker

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// openWide writes a wide ImageFolder (data.WriteCodeSet) and opens it as a
// logreg job of epochs epochs, batch 16, for rank 0 of 2; the streamed
// set is closed when the test ends.
func openWide(t *testing.T, classes, perClass, epochs int) (*pb.JobSpec, *streamed) {
	t.Helper()
	dir := t.TempDir()
	if err := data.WriteCodeSet(context.Background(), dir, classes, perClass, 3); err != nil {
		t.Fatal(err)
	}
	spec := streamedSpec(t, &pb.DatasetSpec{Name: "imagefolder", DataDir: dir, Channels: 1}, func(s *pb.JobSpec) {
		s.Model = "logreg"
		s.BatchSize = proto.Int32(16)
		s.GradAccumSteps = 1
		s.Epochs = proto.Int32(int32(epochs))
		s.LogEverySteps = 100000
		s.EvalEveryEpoch = proto.Bool(false)
	})
	if k := spec.GetDataset().GetShape().GetClasses(); k != int32(classes) {
		t.Fatalf("resolved %d classes, want %d", k, classes)
	}
	s, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return spec, s
}

// sgdSync is a synchronizer of one rank that applies plain SGD to the
// rank's own gradient (fakeSync leaves the parameters alone).
type sgdSync struct {
	fakeSync
	lr float32
}

func (g *sgdSync) step(ctx context.Context, grads, params []float32) error {
	for i, d := range grads {
		params[i] -= g.lr * d
	}
	return g.fakeSync.step(ctx, grads, params)
}

// TestWideLabelSpace: a single-label ImageFolder of 300 classes (more than
// a byte holds) opens with 300 classes, its labels above 255 reach the loss
// unchanged, it trains to far above chance, and the evaluation counts every
// class (per-class accuracies for all 300; no confusion matrix in the
// result above jobspec.MaxConfusionClasses). A byte label would wrap class
// 299 to 43 and train the wrong targets.
func TestWideLabelSpace(t *testing.T) {
	const classes = 300
	spec, s := openWide(t, classes, 4, 30)
	if s.classes != classes {
		t.Fatalf("opened %d classes, want %d", s.classes, classes)
	}
	// The last class's images reach the loss as label 299.
	last := []int{s.info.N - 2, s.info.N - 1}
	if err := s.startEpoch(context.Background(), last, 2); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2*s.info.ImageSize())
	if err := s.batch(last, x, 0); err != nil {
		t.Fatal(err)
	}
	if s.yc[0] != classes-1 || s.yc[1] != classes-1 {
		t.Fatalf("targets of the last class's images %v, want [%d %d]", s.yc[:2], classes-1, classes-1)
	}
	s.endEpoch()

	sync := sgdSync{lr: 0.5}
	res, err := trainerOver(t, spec, s, &sync, quietEnv()).run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("300 classes, logreg, 30 epochs of SGD on rank 0's half: test accuracy %.4f, loss %.4f", res.TestAccuracy, res.TestLoss)
	if res.TestAccuracy < 0.5 { // chance is 1/300
		t.Errorf("test accuracy %.4f, want ≥ 0.5 (chance 0.0033)", res.TestAccuracy)
	}
	if len(res.ClassAccuracy) != classes {
		t.Errorf("%d class accuracies, want %d", len(res.ClassAccuracy), classes)
	}
	if classes > jobspec.MaxConfusionClasses && len(res.ConfusionMatrix) != 0 {
		t.Errorf("a %d-entry confusion matrix in the result, want none above %d classes", len(res.ConfusionMatrix), jobspec.MaxConfusionClasses)
	}
	var high float64
	for _, a := range res.ClassAccuracy[256:] {
		high += a
	}
	if high == 0 {
		t.Errorf("no class above 255 is ever predicted correctly")
	}
}

// TestWideLabelSpaceSparse: 2,100 single-label classes — past the 2,048
// that jobspec refused before and past eval.DenseConfusionClasses, so the
// evaluation holds its confusion matrix sparse — train to far above
// chance, with a per-class accuracy for every class and no matrix in the
// result.
func TestWideLabelSpaceSparse(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 6,300 PNGs")
	}
	const classes = 2100
	spec, s := openWide(t, classes, 2, 12)
	sync := sgdSync{lr: 0.5}
	res, err := trainerOver(t, spec, s, &sync, quietEnv()).run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d classes, logreg, 12 epochs of SGD on rank 0's half: test accuracy %.4f, loss %.4f", classes, res.TestAccuracy, res.TestLoss)
	if res.TestAccuracy < 0.5 { // chance is 1/2100
		t.Errorf("test accuracy %.4f, want ≥ 0.5 (chance 0.0005)", res.TestAccuracy)
	}
	if len(res.ClassAccuracy) != classes || len(res.ConfusionMatrix) != 0 {
		t.Errorf("%d class accuracies and a %d-entry matrix, want %d and none", len(res.ClassAccuracy), len(res.ConfusionMatrix), classes)
	}
	var high float64
	for _, a := range res.ClassAccuracy[2048:] {
		high += a
	}
	if high == 0 {
		t.Errorf("no class above 2047 is ever predicted correctly")
	}
}
