// Command loaderbench measures gradsync's streaming loader on an
// ImageFolder of PNGs: one pass over the training split in batches of 64,
// decoding on -workers goroutines (GOMAXPROCS is set to match, so
// -workers 1 is one core), with no cache, each batch normalised per
// channel as a training step receives it (torchvision's ToTensor +
// Normalize). It prints images per second, for comparison with
// scripts/loaderbench_torch.py (torchvision's ImageFolder + DataLoader) on
// the same folder:
//
//	go run ./scripts/loaderbench -write /tmp/png32 -n 10000   # colour set as 32×32 RGB PNGs
//	go run ./scripts/loaderbench -dir /tmp/png32 -workers 1
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/gradsync/gradsync/data"
)

func main() {
	dir := flag.String("dir", "", "ImageFolder to read (DIR/train/<class>/*.png)")
	write := flag.String("write", "", "write the synthetic colour set (data.ColorSet, 20 coarse classes) as 32×32 RGB PNGs into this folder, then exit")
	n := flag.Int("n", 10000, "with -write: training images (and n/5 test images)")
	workers := flag.Int("workers", 1, "decoding goroutines (and GOMAXPROCS)")
	batch := flag.Int("batch", 64, "images per batch")
	flag.Parse()
	ctx := context.Background()
	if *write != "" {
		if err := writePNGs(ctx, *write, *n); err != nil {
			fmt.Fprintln(os.Stderr, "loaderbench:", err)
			os.Exit(1)
		}
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: loaderbench -dir DIR [-workers N] | -write DIR [-n N]")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(*workers)
	srcs, err := data.OpenSources(ctx, data.SourceOptions{Name: data.ImageFolderSet, Dir: *dir, Image: data.ImageFolderOptions{Channels: 3}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loaderbench:", err)
		os.Exit(1)
	}
	defer srcs.Close()
	in := srcs.Train.Info()
	norm, err := data.NewNormalizer(in, []float64{0.5, 0.5, 0.5}, []float64{0.25, 0.25, 0.25})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loaderbench:", err)
		os.Exit(1)
	}
	order := make([]int, in.N)
	for i := range order {
		order[i] = i
	}
	start := time.Now()
	l, err := data.NewLoader(ctx, srcs.Train, order, data.LoaderConfig{Batch: *batch, Workers: *workers})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loaderbench:", err)
		os.Exit(1)
	}
	defer l.Close()
	x := make([]float32, *batch*in.ImageSize())
	images := 0
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loaderbench:", err)
			os.Exit(1)
		}
		norm.Apply(x[:len(b.Pix)], b.Pix)
		images += len(b.Indices)
	}
	sec := time.Since(start).Seconds()
	fmt.Printf("gradsync loader workers=%d: %d images %dx%dx%d in %.3f s: %.0f images/s\n", *workers, images, in.C, in.H, in.W, sec, float64(images)/sec)
}

func writePNGs(ctx context.Context, dir string, n int) error {
	for _, split := range []struct {
		name string
		n    int
		test bool
	}{{"train", n, false}, {"test", max(n/5, 1), true}} {
		coarse, _, pix := data.ColorSet(split.n, 1, split.test)
		if err := data.WriteImageFolder(ctx, dir, split.name, pix, coarse, split.n, 3, data.CIFARSide, data.CIFARSide, 20); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %d training and %d test PNGs (32×32 RGB, 20 classes) to %s\n", n, max(n/5, 1), dir)
	return nil
}
