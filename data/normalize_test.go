package data

import (
	"context"
	"io"
	"slices"
	"testing"
)

func TestNormalizer(t *testing.T) {
	// One channel: bit-identical to the IDX loaders' standardisation.
	sp := syntheticRaw(2, 20)
	m, s := pixelStats(sp.pix)
	n, err := NewNormalizer(Info{N: 20, C: 1, H: 28, W: 28}, []float64{m}, []float64{s})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(sp.pix))
	n.Apply(got, sp.pix)
	if !slices.Equal(got, standardise(sp.pix, m, s)) {
		t.Error("one-channel normalisation differs from standardise")
	}
	// Three channels, two images: each plane with its own statistics.
	in := Info{N: 2, C: 3, H: 1, W: 2}
	n, err = NewNormalizer(in, []float64{0, 0.5, 1}, []float64{1, 0.5, 2})
	if err != nil {
		t.Fatal(err)
	}
	pix := []uint8{0, 255, 0, 255, 0, 255, 255, 0, 255, 0, 255, 0}
	dst := make([]float32, 12)
	n.Apply(dst, pix)
	want := []float32{0, 1, -1, 1, -0.5, 0, 1, 0, 1, -1, 0, -0.5}
	if !slices.Equal(dst, want) {
		t.Errorf("normalised %v, want %v", dst, want)
	}
	for _, c := range []struct {
		mean, std []float64
		want      string
	}{
		{[]float64{0, 0}, []float64{1, 1}, "2 means"},
		{[]float64{0}, []float64{0}, "std > 0"},
		{[]float64{0}, []float64{-1}, "std > 0"},
	} {
		_, err := NewNormalizer(in, c.mean, c.std)
		wantErr(t, err, c.want)
	}
}

// TestImageFolderThroughLoader streams a real ImageFolder with several
// decoders in a resumed sampler order, normalises each batch, and checks
// every image against a direct Read.
func TestImageFolderThroughLoader(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, fine, pix := ColorSet(40, 3, false)
	for i := range fine {
		fine[i] %= 4
	}
	if err := WriteImageFolder(ctx, dir, "train", pix, fine, 40, 3, 32, 32, 4); err != nil {
		t.Fatal(err)
	}
	if err := WriteImageFolder(ctx, dir, "test", pix[:cifarPixels], fine[:1], 1, 3, 32, 32, 4); err != nil {
		t.Fatal(err)
	}
	train, _, err := OpenImageFolder(ctx, dir, ImageFolderOptions{Transform: Transform{H: 24, W: 20}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ChannelStats(ctx, train, 3)
	if err != nil {
		t.Fatal(err)
	}
	norm, err := NewNormalizer(train.Info(), st.Mean, st.Std)
	if err != nil {
		t.Fatal(err)
	}
	order := ResumeSampler(40, 7, 1, 9, 1, 2) // epoch 1 resumed after 9 positions, rank 1 of 2
	l, err := NewLoader(ctx, train, order, LoaderConfig{Batch: 5, Workers: 4, Prefetch: 2, Cache: NewImageCache(train, 10*1440)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var seen []int
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, len(b.Pix))
		norm.Apply(x, b.Pix)
		for j, i := range b.Indices {
			want := make([]float32, 1440)
			norm.Apply(want, readAll(t, train, i))
			if !slices.Equal(x[j*1440:(j+1)*1440], want) || b.Labels[j] != train.Label(i) {
				t.Fatalf("index %d differs through the loader", i)
			}
		}
		seen = append(seen, b.Indices...)
	}
	if !slices.Equal(seen, order) {
		t.Errorf("loader order %v, want %v", seen, order)
	}
}
