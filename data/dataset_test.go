package data

import (
	"math"
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
