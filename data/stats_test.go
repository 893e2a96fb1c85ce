package data

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
)

// splitSource is a Source over a raw in-memory split, as the IDX loaders
// decode it, to check sources against the existing path.
type splitSource struct {
	sp      split
	classes int
	fp      string
	reads   atomic.Int64
}

func (s *splitSource) Info() Info {
	return Info{Name: "split", N: s.sp.n, C: s.sp.c, H: s.sp.h, W: s.sp.w, Classes: s.classes}
}
func (s *splitSource) Label(i int) int32   { return int32(s.sp.labels[i]) }
func (s *splitSource) Fingerprint() string { return s.fp }
func (s *splitSource) Read(i int, dst []uint8) error {
	checkRead("splitSource", s.Info(), i, dst)
	s.reads.Add(1)
	sz := s.Info().ImageSize()
	copy(dst, s.sp.pix[i*sz:(i+1)*sz])
	return nil
}

func syntheticRaw(seed int64, n int) split {
	rt, rtr := newRNG(seed, streamSyntheticTemplates), newRNG(seed, streamSyntheticTrain)
	return syntheticSplit(&rtr, syntheticTemplates(&rt), n)
}

func TestMaterializeMatchesIDXPath(t *testing.T) {
	ctx := context.Background()
	tr, te := syntheticRaw(3, 300), syntheticRaw(4, 50)
	wantTrain, wantTest, err := newDatasets("synthetic", 10, tr, te)
	if err != nil {
		t.Fatal(err)
	}
	src := &splitSource{sp: tr, classes: 10}
	st, err := ChannelStats(ctx, src, 3)
	if err != nil {
		t.Fatal(err)
	}
	m, s := pixelStats(tr.pix)
	if st.N != 300 || st.Mean[0] != m || st.Std[0] != s || st.OverallMean != m || st.OverallStd != s {
		t.Fatalf("ChannelStats = %+v, pixelStats = %v, %v", st, m, s)
	}
	for _, c := range []struct {
		sp   split
		want *Dataset
	}{{tr, wantTrain}, {te, wantTest}} {
		got, err := Materialize(ctx, &splitSource{sp: c.sp, classes: 10}, st.Mean, st.Std, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Images, c.want.Images) || !slices.Equal(got.Labels, c.want.Labels) ||
			got.Mean != c.want.Mean || got.Std != c.want.Std || got.N != c.want.N || got.C != 1 || got.Classes != 10 {
			t.Errorf("Materialize differs from the IDX path's Dataset")
		}
	}
}

func TestChannelStatsRGB(t *testing.T) {
	src := newFakeSource(9, 3, 2, 3)
	st, err := ChannelStats(context.Background(), src, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The reference: float sums over each plane of every image.
	dst := make([]uint8, 18)
	var all []uint8
	planes := make([][]uint8, 3)
	for i := range 9 {
		src.Read(i, dst)
		all = append(all, dst...)
		for c := range 3 {
			planes[c] = append(planes[c], dst[c*6:(c+1)*6]...)
		}
	}
	for c := range 3 {
		m, s := pixelStats(planes[c])
		if math.Abs(st.Mean[c]-m) > 1e-15 || math.Abs(st.Std[c]-s) > 1e-15 {
			t.Errorf("channel %d: %v ± %v, want %v ± %v", c, st.Mean[c], st.Std[c], m, s)
		}
	}
	if m, s := pixelStats(all); st.OverallMean != m || st.OverallStd != s {
		t.Errorf("overall %v ± %v, want %v ± %v", st.OverallMean, st.OverallStd, m, s)
	}
	// A colour source materialises with the pooled statistics, or with
	// per-channel ones, each channel through its own table.
	ds, err := Materialize(context.Background(), src, []float64{st.OverallMean}, []float64{st.OverallStd}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ds.C != 3 || ds.N != 9 || ds.Labels[8] != 1 || len(ds.Images) != 9*18 {
		t.Errorf("materialised N=%d C=%d labels %v", ds.N, ds.C, ds.Labels)
	}
	pc, err := Materialize(context.Background(), src, st.Mean, st.Std, 0)
	if err != nil {
		t.Fatal(err)
	}
	norm, err := NewNormalizer(src.Info(), st.Mean, st.Std)
	if err != nil {
		t.Fatal(err)
	}
	pix := make([]uint8, 18)
	want := make([]float32, 18)
	if err := src.Read(4, pix); err != nil {
		t.Fatal(err)
	}
	norm.Apply(want, pix)
	if !slices.Equal(pc.Image(4), want) || !slices.Equal(pc.ChannelMean, st.Mean) || !slices.Equal(pc.ChannelStd, st.Std) {
		t.Errorf("per-channel Materialize: image 4 %v, want %v; channel stats %v, %v", pc.Image(4), want, pc.ChannelMean, pc.ChannelStd)
	}
	if ds.ChannelMean != nil {
		t.Errorf("pooled Materialize recorded channel statistics %v", ds.ChannelMean)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("ZeroPixel of a per-channel Dataset did not panic")
			}
		}()
		pc.ZeroPixel()
	}()
	_, err = Materialize(context.Background(), src, []float64{0.5, 0.5}, []float64{1, 1}, 0)
	wantErr(t, err, "2 means and 2 standard deviations for 3 channels")
	_, err = Materialize(context.Background(), src, []float64{0.5}, []float64{0}, 0)
	wantErr(t, err, "std > 0")
	// A label space wider than a byte materialises (int32 labels).
	big := newFakeSource(2, 1, 1, 1)
	big.info.Classes = 1000
	if wide, err := Materialize(context.Background(), big, []float64{0}, []float64{1}, 0); err != nil || wide.Classes != 1000 {
		t.Errorf("Materialize of 1000 classes: %v", err)
	}
}

func TestCachedChannelStats(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, StatsCacheFile)
	src := &splitSource{sp: syntheticRaw(1, 40), classes: 10, fp: "files-v1"}
	first, err := CachedChannelStats(ctx, src, path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if src.reads.Load() != 40 {
		t.Fatalf("%d reads computing the statistics, want 40", src.reads.Load())
	}
	again, err := CachedChannelStats(ctx, src, path, 1)
	if err != nil || src.reads.Load() != 40 || !slices.Equal(again.Mean, first.Mean) || !slices.Equal(again.Std, first.Std) || again.OverallStd != first.OverallStd {
		t.Fatalf("cached: %+v (err %v) after %d reads; want %+v without reading", again, err, src.reads.Load(), first)
	}
	// Changed files: recomputed, and the old entry is kept beside it.
	src.fp = "files-v2"
	if _, err := CachedChannelStats(ctx, src, path, 1); err != nil || src.reads.Load() != 80 {
		t.Fatalf("new fingerprint: err %v, %d reads, want 80", err, src.reads.Load())
	}
	src.fp = "files-v1"
	if _, err := CachedChannelStats(ctx, src, path, 1); err != nil || src.reads.Load() != 80 {
		t.Fatalf("old fingerprint: err %v, %d reads, want the kept entry", err, src.reads.Load())
	}
	// A corrupt cache is recomputed and rewritten.
	os.WriteFile(path, []byte("{not json"), 0o644)
	if _, err := CachedChannelStats(ctx, src, path, 1); err != nil || src.reads.Load() != 120 {
		t.Fatalf("corrupt cache: err %v, %d reads", err, src.reads.Load())
	}
	if _, err := CachedChannelStats(ctx, src, path, 1); err != nil || src.reads.Load() != 120 {
		t.Fatalf("rewritten cache: err %v, %d reads", err, src.reads.Load())
	}
	// An unwritable place gives the statistics and ErrStatsNotSaved.
	st, err := CachedChannelStats(ctx, src, filepath.Join(dir, "no", "such", "dir", StatsCacheFile), 1)
	if !errors.Is(err, ErrStatsNotSaved) || !slices.Equal(st.Mean, first.Mean) {
		t.Errorf("unwritable cache: %+v, %v", st, err)
	}
}

func TestImageFolderFingerprint(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "train/a/1.png", encodePNG(t, grayImage(2, 2, 0)))
	writeFile(t, dir, "test/a/1.png", encodePNG(t, grayImage(2, 2, 0)))
	open := func(opt ImageFolderOptions) string {
		tr, _, err := OpenImageFolder(context.Background(), dir, opt)
		if err != nil {
			t.Fatal(err)
		}
		return tr.Fingerprint()
	}
	a := open(ImageFolderOptions{})
	if open(ImageFolderOptions{}) != a {
		t.Fatal("fingerprint is not stable")
	}
	if open(ImageFolderOptions{Transform: Transform{H: 3, W: 3}}) == a {
		t.Error("fingerprint ignores the decoded size")
	}
	writeFile(t, dir, "train/a/2.png", encodePNG(t, grayImage(2, 2, 0)))
	b := open(ImageFolderOptions{})
	if b == a {
		t.Error("fingerprint ignores a new file")
	}
	// Same names, one file grown (PNG decoders stop at IEND).
	writeFile(t, dir, "train/a/2.png", append(encodePNG(t, grayImage(2, 2, 0)), 0, 0, 0))
	if open(ImageFolderOptions{}) == b {
		t.Error("fingerprint ignores a file's size")
	}
	path := filepath.Join(dir, StatsCacheFile)
	tr, _, _ := OpenImageFolder(context.Background(), dir, ImageFolderOptions{})
	st, err := CachedChannelStats(context.Background(), tr, path, 0)
	if err != nil || st.N != 2 || len(st.Mean) != 1 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	// The cache file in dir does not disturb the layout.
	if _, _, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{}); err != nil {
		t.Fatal(err)
	}
}
