package worker

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// streamedSpec is a ring job of rank 0 of 2 on dataset d (data_dir dir),
// its shape resolved as the submitting client resolves it.
func streamedSpec(t *testing.T, d *pb.DatasetSpec, edit func(*pb.JobSpec)) *pb.JobSpec {
	t.Helper()
	in := &pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: d, Workers: proto.Int32(2),
		BatchSize: proto.Int32(4), GradAccumSteps: 2, Epochs: proto.Int32(2), LogEverySteps: 3, EvalEveryEpoch: proto.Bool(true)}
	if edit != nil {
		edit(in)
	}
	if err := jobspec.ResolveShape(context.Background(), in, ""); err != nil {
		t.Fatal(err)
	}
	spec, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func quietEnv() *taskEnv {
	return &taskEnv{rep: &reporter{ctx: context.Background(), out: make(chan *pb.ConnectRequest, 1000)},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// trainerOver is rank 0 of spec's job over obj with the synchronizer s.
func trainerOver(t *testing.T, spec *pb.JobSpec, obj objective, s synchronizer, env *taskEnv) *Trainer {
	t.Helper()
	net, err := models.New(spec.Model, obj.shape())
	if err != nil {
		t.Fatal(err)
	}
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Spec: spec, Rank: 0, WorldSize: 2, NumParams: int64(net.NumParams())}
	tr, err := newTrainer(a, env, obj)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.net.Close)
	tr.sync = s
	return tr
}

// TestStreamedMatchesInMemory: a CIFAR-100-layout set streamed through the
// loader (cached or not, fresh or resumed mid-epoch, with crop-flip
// augmentation) gives bit-identical gradients at every step, and the same
// evaluation, as the same pixels held in memory (data.Materialize) with
// the same normalisation (mean and std exact in float32, so that the
// in-memory path's fill for the crop equals the streamed one) — so the loader changes where pixels come from,
// never what is trained.
func TestStreamedMatchesInMemory(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 60, 24, 5); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		cacheMB int32
		augment string
		resume  position
	}{
		{"no cache", 0, "none", position{}},
		{"cached", 64, "none", position{}},
		{"augmented", 64, "crop-flip", position{}},
		{"resumed", 0, "crop", position{step: 2, consumed: 16}},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := streamedSpec(t, &pb.DatasetSpec{Name: "cifar100", DataDir: dir, LabelGranularity: "coarse",
				Mean: []float64{0.5}, Std: []float64{0.25}, CacheMb: proto.Int32(c.cacheMB), Augment: c.augment}, nil)
			s, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer s.close()
			if s.classes != 20 || s.info.N != 60 || s.test.N != 24 {
				t.Fatalf("opened %d classes, %d train, %d test; want 20, 60, 24", s.classes, s.info.N, s.test.N)
			}
			train, err := data.Materialize(context.Background(), s.srcs.Train.(data.Source), []float64{0.5}, []float64{0.25}, 1)
			if err != nil {
				t.Fatal(err)
			}
			test, err := data.Materialize(context.Background(), s.srcs.Test.(data.Source), []float64{0.5}, []float64{0.25}, 1)
			if err != nil {
				t.Fatal(err)
			}
			mem := newClassification(train, test, spec)
			if mem.aug != nil {
				mem.aug.Pad = streamAugmentPad
			}
			var got, want gradSync
			got.origin = origin{at: c.resume, source: fromMemory}
			want.origin = got.origin
			rs, err := trainerOver(t, spec, s, &got, quietEnv()).run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rm, err := trainerOver(t, spec, mem, &want, quietEnv()).run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(got.grads) == 0 || len(got.grads) != len(want.grads) {
				t.Fatalf("%d streamed steps, %d in memory", len(got.grads), len(want.grads))
			}
			for i := range got.grads {
				if !slices.Equal(got.grads[i], want.grads[i]) {
					t.Fatalf("step %d: streamed gradient differs from the in-memory one", i)
				}
			}
			if rs.TestAccuracy != rm.TestAccuracy || rs.TestLoss != rm.TestLoss || !slices.Equal(rs.ConfusionMatrix, rm.ConfusionMatrix) {
				t.Errorf("evaluation: streamed %v/%v, in memory %v/%v", rs.TestAccuracy, rs.TestLoss, rm.TestAccuracy, rm.TestLoss)
			}
			if rs.LoaderImagesPerSecond <= 0 {
				t.Errorf("loader images/s %v, want > 0", rs.LoaderImagesPerSecond)
			}
			st := s.loaderStats()
			if c.cacheMB > 0 && c.resume == (position{}) && st.CacheHits == 0 {
				t.Errorf("cache of %d MiB: no hit in 2 epochs (%+v)", c.cacheMB, st)
			}
			if c.cacheMB == 0 && st.CacheHits != 0 {
				t.Errorf("no cache, yet %d hits", st.CacheHits)
			}
		})
	}
}

// TestStreamedPerChannelFill: with per-channel statistics, random crop
// pads each channel with its own normalised black, as torchvision pads
// before Normalize.
func TestStreamedPerChannelFill(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 8, 8, 5); err != nil {
		t.Fatal(err)
	}
	spec := streamedSpec(t, &pb.DatasetSpec{Name: "cifar100", DataDir: dir,
		Mean: []float64{0.2, 0.5, 0.8}, Std: []float64{0.1, 0.2, 0.4}, Augment: "crop"}, nil)
	s, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for c, want := range []float32{-2, -2.5, -2} {
		if d := s.fill[c] - want; d > 1e-6 || d < -1e-6 {
			t.Errorf("channel %d: fill %v, want %v", c, s.fill[c], want)
		}
	}
}

// writeFolder writes a valid 2-class ImageFolder of 8×8 grayscale PNGs
// (4 training and 2 test images a class) and returns its root.
func writeFolder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, split := range []struct {
		name string
		n    int
	}{{"train", 8}, {"test", 4}} {
		pix := make([]uint8, split.n*64)
		labels := make([]uint8, split.n)
		for i := range split.n {
			labels[i] = uint8(i % 2)
			for p := range 64 {
				pix[i*64+p] = uint8(i*37 + p*int(labels[i]+1))
			}
		}
		if err := data.WriteImageFolder(context.Background(), dir, split.name, pix, labels, split.n, 1, 8, 8, 2); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func writeBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStreamedBadInput: each kind of bad data fails the task with an
// error naming the file at fault — when the worker opens the data (the
// spec's shape given by a client of its own, so the worker is the first
// to look), or at the step that decodes it — and the submitting client's
// ResolveShape refuses the same data with the same file named, where
// opening shows the fault.
func TestStreamedBadInput(t *testing.T) {
	firstTrain := func(dir string) string { return filepath.Join(dir, "train", "0", "0.png") }
	for _, c := range []struct {
		name  string
		ds    func(dir string) *pb.DatasetSpec
		spoil func(t *testing.T, dir string) string // returns what the error must name
		atRun bool                                  // the fault shows only when the image is decoded
	}{
		{name: "truncated PNG", atRun: true, spoil: func(t *testing.T, dir string) string {
			p := firstTrain(dir)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			writeBytes(t, p, b[:len(b)/2])
			return p
		}},
		{name: "JPEG with a wrong header", spoil: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "train", "1", "bad.jpg")
			writeBytes(t, p, append([]byte{0xff, 0xd8, 0xff, 0x00, 0x13, 0x37}, make([]byte, 64)...))
			return p
		}},
		{name: "non-image file in a class folder", spoil: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "train", "0", "notes.png")
			writeBytes(t, p, []byte("these are my notes, not a picture\n"))
			return p
		}},
		{name: "empty class folder", spoil: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "train", "2")
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{name: "test class missing from train", spoil: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "test", "7")
			b, err := os.ReadFile(firstTrain(dir))
			if err != nil {
				t.Fatal(err)
			}
			writeBytes(t, filepath.Join(p, "x.png"), b)
			return p
		}},
		{name: "mixed sizes without image_size", spoil: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "train", "1", "big.png")
			big := t.TempDir()
			if err := data.WriteImageFolder(context.Background(), big, "x", make([]uint8, 100), []uint8{0}, 1, 1, 10, 10, 1); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(big, "x", "0", "0.png"))
			if err != nil {
				t.Fatal(err)
			}
			writeBytes(t, p, b)
			return p
		}},
		{name: "labels.csv naming a missing file", spoil: func(t *testing.T, dir string) string {
			writeBytes(t, filepath.Join(dir, data.LabelsCSV), []byte("path,labels\ntrain/0/0.png,a;b\ntrain/0/gone.png,a\ntest/0/1.png,b\n"))
			return "gone.png"
		}},
		{name: "CIFAR file not whole records",
			ds: func(dir string) *pb.DatasetSpec { return &pb.DatasetSpec{Name: "cifar100", DataDir: dir} },
			spoil: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "train.bin")
				if err := data.WriteColorSet(dir, 4, 4, 1); err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write(make([]byte, 100))
				f.Close()
				return p
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dir string
			var ds *pb.DatasetSpec
			if c.ds != nil {
				dir = t.TempDir()
				ds = c.ds(dir)
			} else {
				dir = writeFolder(t)
				ds = &pb.DatasetSpec{Name: "imagefolder", DataDir: dir, Channels: 1}
			}
			good := proto.Clone(ds).(*pb.DatasetSpec)
			if c.ds == nil {
				// The shape of the unspoilt folder, as a client that read
				// it before it was spoilt would send.
				spec := streamedSpec(t, good, nil)
				good = spec.Dataset
			} else {
				good.Shape = &pb.DataShape{Channels: 3, Height: 32, Width: 32, Classes: 100}
			}
			name := c.spoil(t, dir)
			multi := strings.Contains(c.name, "labels.csv")
			if multi {
				good.Shape.MultiLabel = true
				good.Shape.ClassNames = nil
			}
			if !c.atRun {
				in := &pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: proto.Clone(ds).(*pb.DatasetSpec)}
				err := jobspec.ResolveShape(context.Background(), in, "")
				if err == nil || !strings.Contains(err.Error(), name) {
					t.Errorf("the client's ResolveShape: %v; want an error naming %s", err, name)
				}
			}
			spec, err := jobspec.Normalize(&pb.JobSpec{Model: "mlp", Mode: "ring", Dataset: good, Workers: proto.Int32(2),
				BatchSize: proto.Int32(4), MaxSteps: 3}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
			if !c.atRun {
				if err == nil {
					s.close()
					t.Fatalf("the worker opened the spoilt data; want an error naming %s", name)
				}
				if !strings.Contains(err.Error(), name) {
					t.Fatalf("the worker's error %q does not name %s", err, name)
				}
				t.Log(err)
				return
			}
			if err == nil {
				defer s.close()
				_, err = trainerOver(t, spec, s, &fakeSync{}, quietEnv()).run(context.Background())
			}
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("task error %v; want one naming %s", err, name)
			}
			t.Log(err)
		})
	}
}

// TestStreamedMultiLabel: an ImageFolder with a labels.csv trains as a
// multi-label task: each batch's targets are its examples' label sets,
// pos_weight is (N−P)/P per class, and the evaluation gives F1 and mAP.
func TestStreamedMultiLabel(t *testing.T) {
	dir := writeFolder(t)
	csv := "path,labels\n"
	for i := range 8 {
		labels := []string{"even"}
		if i%2 == 1 {
			labels = []string{"odd"}
		}
		if i >= 6 {
			labels = append(labels, "big")
		}
		csv += "train/" + string(rune('0'+i%2)) + "/" + string(rune('0'+i)) + ".png," + strings.Join(labels, ";") + "\n"
	}
	csv += "test/0/0.png,even\ntest/1/1.png,odd;big\n"
	writeBytes(t, filepath.Join(dir, data.LabelsCSV), []byte(csv))
	spec := streamedSpec(t, &pb.DatasetSpec{Name: "imagefolder", DataDir: dir, Channels: 1}, nil)
	if sh := spec.Dataset.Shape; !sh.MultiLabel || sh.Classes != 3 {
		t.Fatalf("resolved shape %v; want multi-label with 3 classes (big, even, odd)", sh)
	}
	s, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	// Classes sorted: big 0, even 1, odd 2; big on 2 of 8.
	if s.posWeight[0] != 3 || s.posWeight[2] != 1 {
		t.Errorf("pos_weight %v; want big 6/2 = 3, odd 4/4 = 1", s.posWeight)
	}
	order := []int{7, 0}
	if err := s.startEpoch(context.Background(), order, 2); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2*64)
	if err := s.batch(order, x, 0); err != nil {
		t.Fatal(err)
	}
	want := []float32{1, 0, 1 /* 7: odd, big */, 0, 1, 0 /* 0: even */}
	if !slices.Equal(s.ym, want) {
		t.Errorf("targets %v, want %v", s.ym, want)
	}
	s.endEpoch()
	res, err := trainerOver(t, spec, s, &fakeSync{}, quietEnv()).run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.MeanAveragePrecision <= 0 || res.TestLoss <= 0 {
		t.Errorf("result mAP %v, loss %v; want both > 0", res.MeanAveragePrecision, res.TestLoss)
	}
}

// TestStreamedFederated: a fedavg job on a streamed set trains its
// clients on the set read into memory, normalised per channel, with the
// partitioners over its 100 fine classes.
func TestStreamedFederated(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 200, 40, 3); err != nil {
		t.Fatal(err)
	}
	in := &pb.JobSpec{Model: "mlp", Mode: "fedavg", Dataset: &pb.DatasetSpec{Name: "cifar100", DataDir: dir},
		Partition: &pb.PartitionSpec{Type: "dirichlet", Alpha: 0.5},
		Federated: &pb.FederatedSpec{Rounds: 2, Clients: 4, Fraction: 0.5, LocalEpochs: 1, LocalBatchSize: 10}}
	if err := jobspec.ResolveShape(context.Background(), in, ""); err != nil {
		t.Fatal(err)
	}
	spec, err := jobspec.Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	train, test, err := materializeStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if train.Classes != 100 || train.C != 3 || len(train.ChannelMean) != 3 || test.N != 40 {
		t.Fatalf("materialised %d classes, %d channels, channel means %v, %d test", train.Classes, train.C, train.ChannelMean, test.N)
	}
	if train.ChannelMean[0] == train.ChannelMean[1] {
		t.Errorf("channel means %v: the per-channel statistics were not used", train.ChannelMean)
	}
	net, err := models.New(spec.Model, models.Options{Channels: 3, Height: 32, Width: 32, Classes: 100})
	if err != nil {
		t.Fatal(err)
	}
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Spec: spec, Rank: 0, WorldSize: 1, NumParams: int64(net.NumParams())}
	res, err := runFederated(context.Background(), a, quietEnv(), train, test)
	if err != nil {
		t.Fatal(err)
	}
	if res.Epochs != 2 || !(res.TestLoss > 0) || res.TestLoss > 100 {
		t.Errorf("result: %d rounds, test loss %v; want 2 rounds and a finite loss", res.Epochs, res.TestLoss)
	}
}
