package worker

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/data"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestStreamedColorJitter: colour jitter (hue among it) is off unless
// the spec sets it; when set, two workers of one seed give the same
// training inputs, each epoch another, another seed others, and
// evaluation inputs are never jittered.
func TestStreamedColorJitter(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 16, 8, 5); err != nil {
		t.Fatal(err)
	}
	order := []int{3, 1, 4, 0, 5, 7, 2, 6}
	inputs := func(b, c, s, h float64, seed int64, epoch int, train bool) []float32 {
		t.Helper()
		spec := streamedSpec(t, &pb.DatasetSpec{Name: "cifar100", DataDir: dir, LabelGranularity: "coarse", Mean: []float64{0.5}, Std: []float64{0.25},
			JitterBrightness: b, JitterContrast: c, JitterSaturation: s, JitterHue: h}, func(js *pb.JobSpec) { js.Seed = &seed })
		st, err := openStreamed(context.Background(), spec, "", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		if (st.jitter != nil) != (b != 0 || c != 0 || s != 0 || h != 0) {
			t.Fatalf("jitter %v,%v,%v,%v: enabled = %v", b, c, s, h, st.jitter != nil)
		}
		x := make([]float32, len(order)*st.info.ImageSize())
		if !train {
			l, err := data.NewLoader(context.Background(), st.srcs.Test, order, data.LoaderConfig{Batch: len(order)})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			bt, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			st.fillInputs(x, bt, st.srcs.Test, order, epoch, false)
			return x
		}
		if err := st.startEpoch(context.Background(), order, len(order)); err != nil {
			t.Fatal(err)
		}
		if err := st.batch(order, x, epoch); err != nil {
			t.Fatal(err)
		}
		return x
	}
	plain := inputs(0, 0, 0, 0, 1, 0, true)
	a := inputs(0.4, 0.4, 0.4, 0, 1, 0, true)
	if slices.Equal(plain, a) {
		t.Fatal("jitter 0.4,0.4,0.4 leaves the training inputs unchanged")
	}
	if !slices.Equal(a, inputs(0.4, 0.4, 0.4, 0, 1, 0, true)) {
		t.Error("the same seed and epoch jitter differently")
	}
	if slices.Equal(a, inputs(0.4, 0.4, 0.4, 0, 1, 1, true)) {
		t.Error("epoch 1 jitters as epoch 0 does")
	}
	if slices.Equal(a, inputs(0.4, 0.4, 0.4, 0, 2, 0, true)) {
		t.Error("seed 2 jitters as seed 1 does")
	}
	if !slices.Equal(plain, inputs(0, 0, 0, 0, 1, 1, true)) {
		t.Error("without jitter (and augmentation) the inputs depend on the epoch")
	}
	if !slices.Equal(inputs(0, 0, 0, 0, 1, 0, false), inputs(0.4, 0.4, 0.4, 0, 1, 0, false)) {
		t.Error("evaluation inputs are jittered")
	}
	hue := inputs(0, 0, 0, 0.2, 1, 0, true)
	if slices.Equal(plain, hue) {
		t.Fatal("jitter_hue 0.2 leaves the training inputs unchanged")
	}
	if !slices.Equal(hue, inputs(0, 0, 0, 0.2, 1, 0, true)) {
		t.Error("the same seed and epoch turn the hue differently")
	}
	if slices.Equal(inputs(0.4, 0.4, 0.4, 0.2, 1, 0, true), a) {
		t.Error("jitter 0.4,0.4,0.4,0.2 gives the inputs of 0.4,0.4,0.4")
	}
	if !slices.Equal(inputs(0, 0, 0, 0, 1, 0, false), inputs(0.4, 0.4, 0.4, 0.2, 1, 0, false)) {
		t.Error("evaluation inputs are hue-jittered")
	}
}
