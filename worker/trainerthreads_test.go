package worker

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// gradSync is a fakeSync that keeps each step's gradient.
type gradSync struct {
	fakeSync
	grads [][]float32
}

func (g *gradSync) step(ctx context.Context, grads, params []float32) error {
	g.grads = append(g.grads, slices.Clone(grads))
	return g.fakeSync.step(ctx, grads, params)
}

// threadTrainer is testTrainer's rank with the worker's thread count set.
func threadTrainer(t *testing.T, model string, threads int, s synchronizer) *Trainer {
	t.Helper()
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: model, Mode: "ring", Dataset: &pb.DatasetSpec{Name: "synthetic"},
		Workers: proto.Int32(2), BatchSize: proto.Int32(8), Epochs: proto.Int32(1), MaxSteps: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	train, test, err := data.Synthetic(100, 20, 7)
	if err != nil {
		t.Fatal(err)
	}
	obj := newClassification(train, test, spec)
	net, err := models.New(spec.Model, obj.shape())
	if err != nil {
		t.Fatal(err)
	}
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Spec: spec, Rank: 0, WorldSize: 2, NumParams: int64(net.NumParams())}
	env := &taskEnv{rep: &reporter{ctx: context.Background(), out: make(chan *pb.ConnectRequest, 100)},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), threads: threads}
	tr, err := newTrainer(a, env, obj)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.net.Close)
	tr.sync = s
	return tr
}

// TestTrainerThreads: Config.Threads runs the Trainer's steps on that
// many goroutines, with the one-thread gradients up to float32 rounding,
// batch-norm models included.
func TestTrainerThreads(t *testing.T) {
	one, two := &gradSync{}, &gradSync{}
	for _, c := range []struct {
		threads int
		s       *gradSync
	}{{1, one}, {2, two}} {
		tr := threadTrainer(t, "mlp", c.threads, c.s)
		if tr.net.Threads() != c.threads {
			t.Fatalf("network on %d threads, want %d", tr.net.Threads(), c.threads)
		}
		if _, err := tr.run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(one.grads) != 3 || len(two.grads) != 3 {
		t.Fatalf("%d and %d steps, want 3", len(one.grads), len(two.grads))
	}
	for i := range one.grads {
		var d, m float64
		for j, v := range one.grads[i] {
			d = max(d, math.Abs(float64(v-two.grads[i][j])))
			m = max(m, math.Abs(float64(v)))
		}
		if d > 1e-5*m {
			t.Errorf("step %d: 2 threads' gradient differs by %.3g (‖g‖∞ %.3g)", i, d, m)
		}
	}
	if tr := threadTrainer(t, "resnet8", 2, &gradSync{}); tr.net.Threads() != 2 {
		t.Errorf("resnet8 on %d threads, want 2", tr.net.Threads())
	}
}
