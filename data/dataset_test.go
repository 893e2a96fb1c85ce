package data

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPixelStats(t *testing.T) {
	pix := []uint8{0, 255, 0, 255}
	mean, std := pixelStats(pix)
	if math.Abs(mean-0.5) > 1e-12 || math.Abs(std-0.5) > 1e-12 {
		t.Fatalf("mean, std = %v, %v; want 0.5, 0.5", mean, std)
	}
	if _, std := pixelStats([]uint8{7, 7, 7}); std != 1 {
		t.Fatalf("constant pixels: std = %v, want the fallback 1", std)
	}
}

func TestNewDatasetsStandardises(t *testing.T) {
	tr := split{pix: []uint8{0, 51, 102, 153, 204, 255, 0, 255}, labels: []uint8{0, 1}, n: 2, c: 1, h: 2, w: 2}
	te := split{pix: []uint8{255, 255, 255, 255}, labels: []uint8{1}, n: 1, c: 1, h: 2, w: 2}
	train, test, err := newDatasets("t", 2, tr, te)
	if err != nil {
		t.Fatal(err)
	}
	var sum, ss float64
	for _, v := range train.Images {
		sum += float64(v)
		ss += float64(v) * float64(v)
	}
	n := float64(len(train.Images))
	if m, v := sum/n, ss/n-(sum/n)*(sum/n); math.Abs(m) > 1e-6 || math.Abs(v-1) > 1e-5 {
		t.Fatalf("standardised train mean %v, variance %v; want 0, 1", m, v)
	}
	if test.Mean != train.Mean || test.Std != train.Std {
		t.Fatalf("test split stats %v/%v differ from train's %v/%v", test.Mean, test.Std, train.Mean, train.Std)
	}
	want := float32((1 - float64(train.Mean)) / float64(train.Std))
	if math.Abs(float64(test.Images[0]-want)) > 1e-5 {
		t.Fatalf("test pixel 255 → %v, want (1−trainMean)/trainStd = %v", test.Images[0], want)
	}
}

func TestNewDatasetsErrors(t *testing.T) {
	ok := split{pix: make([]uint8, 4), labels: []uint8{0}, n: 1, c: 1, h: 2, w: 2}
	for _, tt := range []struct {
		name        string
		train, test split
		want        string
	}{
		{"label range", split{pix: make([]uint8, 4), labels: []uint8{3}, n: 1, c: 1, h: 2, w: 2}, ok, "label 3 at index 0"},
		{"label count", split{pix: make([]uint8, 4), labels: []uint8{0, 1}, n: 1, c: 1, h: 2, w: 2}, ok, "1 images but 2 labels"},
		{"shape", ok, split{pix: make([]uint8, 3), labels: []uint8{0}, n: 1, c: 1, h: 3, w: 1}, "test images are 1×3×1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := newDatasets("t", 2, tt.train, tt.test)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestBatch(t *testing.T) {
	train, _, err := Synthetic(20, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	idx := []int{3, 0, 19, 3}
	sz := train.ImageSize()
	x := make([]float32, len(idx)*sz)
	y := make([]int32, len(idx))
	train.Batch(idx, x, y)
	for j, i := range idx {
		if y[j] != train.Labels[i] {
			t.Fatalf("y[%d] = %d, want label %d", j, y[j], train.Labels[i])
		}
		img := train.Image(i)
		for k := range img {
			if x[j*sz+k] != img[k] {
				t.Fatalf("x[%d] differs from image %d at %d", j, i, k)
			}
		}
	}
	if a := testing.AllocsPerRun(100, func() { train.Batch(idx, x, y) }); a != 0 {
		t.Fatalf("Batch allocates %v times per call, want 0", a)
	}
	if train.Len() != 20 || sz != 28*28 {
		t.Fatalf("Len %d, ImageSize %d", train.Len(), sz)
	}
}

func TestBatchPanics(t *testing.T) {
	train, _, err := Synthetic(5, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	sz := train.ImageSize()
	for name, f := range map[string]func(){
		"short x":  func() { train.Batch([]int{0, 1}, make([]float32, sz), make([]int32, 2)) },
		"short y":  func() { train.Batch([]int{0, 1}, make([]float32, 2*sz), make([]int32, 1)) },
		"index":    func() { train.Batch([]int{5}, make([]float32, sz), make([]int32, 1)) },
		"negative": func() { train.Batch([]int{-1}, make([]float32, sz), make([]int32, 1)) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.HasPrefix(r.(string), "data: Batch") {
					t.Fatalf("recovered %v, want a data: Batch panic", r)
				}
			}()
			f()
		})
	}
}

func BenchmarkBatch(b *testing.B) {
	train, _, err := Synthetic(1000, 10, 1)
	if err != nil {
		b.Fatal(err)
	}
	idx := make([]int, 64)
	for i := range idx {
		idx[i] = (i * 37) % train.N
	}
	x := make([]float32, len(idx)*train.ImageSize())
	y := make([]int32, len(idx))
	b.ReportAllocs()
	for b.Loop() {
		train.Batch(idx, x, y)
	}
}

// multiFake is a fakeSource with label sets: example i has the classes
// of the bits of i mod 8 (i = 0: none).
type multiFake struct{ *fakeSource }

func (m multiFake) LabelSet(i int) []int32 {
	var s []int32
	for b := range 3 {
		if (i%8)>>b&1 == 1 {
			s = append(s, int32(b))
		}
	}
	return s
}

// TestMaterializeMultiLabel: a MultiSource materialises with its label
// sets (no Labels), MultiHot gives multi-hot targets, and the label
// histogram counts an example once per label.
func TestMaterializeMultiLabel(t *testing.T) {
	src := multiFake{newFakeSource(10, 1, 2, 2)}
	src.info.Classes = 3
	d, err := Materialize(context.Background(), src, []float64{0.5}, []float64{0.25}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.MultiLabel() || d.Labels != nil || len(d.LabelSets) != 10 || !slices.Equal(d.LabelSets[7], []int32{0, 1, 2}) {
		t.Fatalf("multi-label %v, labels %v, sets %v", d.MultiLabel(), d.Labels, d.LabelSets)
	}
	x, y := make([]float32, 2*4), make([]float32, 2*3)
	d.MultiHot([]int{5, 0}, x, y)
	if want := []float32{1, 0, 1, 0, 0, 0}; !slices.Equal(y, want) {
		t.Errorf("targets %v, want %v", y, want)
	}
	if !slices.Equal(x[:4], d.Image(5)) || !slices.Equal(x[4:], d.Image(0)) {
		t.Errorf("images %v, want examples 5 and 0", x)
	}
	// Examples 1..9: bits of 1..7, 0, 1 → class 0 in 1,3,5,7,9; class 1 in
	// 2,3,6,7; class 2 in 4,5,6,7.
	if h := d.LabelHistogram([]int{1, 2, 3, 4, 5, 6, 7, 8, 9}); !slices.Equal(h, []int{5, 4, 4}) {
		t.Errorf("histogram %v, want [5 4 4]", h)
	}
	single, err := Materialize(context.Background(), newFakeSource(3, 1, 2, 2), []float64{0.5}, []float64{0.25}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if single.MultiLabel() || !slices.Equal(single.LabelHistogram([]int{0, 1, 2, 1}), []int{1, 2, 1, 0, 0, 0, 0}) {
		t.Errorf("single-label: multi %v, histogram %v", single.MultiLabel(), single.LabelHistogram([]int{0, 1, 2, 1}))
	}
	if _, err := Materialize(context.Background(), pixelsOnly{src.fakeSource}, []float64{0.5}, []float64{0.25}, 1); err == nil {
		t.Error("Materialize of a source without labels: no error")
	}
}

// pixelsOnly hides a source's labels.
type pixelsOnly struct{ f *fakeSource }

func (p pixelsOnly) Info() Info                    { return p.f.Info() }
func (p pixelsOnly) Read(i int, dst []uint8) error { return p.f.Read(i, dst) }
