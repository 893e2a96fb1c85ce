// Command idx2imagefolder writes an IDX data set (MNIST, Fashion-MNIST, or
// any folder of the four IDX files) as an ImageFolder of grayscale PNGs,
// OUT/train/<digit>/<index>.png and OUT/test/…, to try the ImageFolder
// reader on familiar data:
//
//	go run ./scripts/idx2imagefolder -data fashion-mnist -out /tmp/fashion-folder
//	go run ./scripts/idx2imagefolder -data mnist -limit 1000 -out /tmp/mnist-1k
//	go run ./scripts/idx2imagefolder -data mine -dir ./idx -out /tmp/mine
//
// Class folders are "0" … "9" and files are numbered in IDX order, so the
// folder's sorted order is the labels' and the images' order.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/gradsync/gradsync/data"
)

func main() {
	name := flag.String("data", data.MNIST, "mnist, fashion-mnist, or any name with -dir")
	dir := flag.String("dir", "", "folder holding the four IDX files (default: where gradsync finds mnist / fashion-mnist)")
	out := flag.String("out", "", "folder to write train/ and test/ into (required)")
	limit := flag.Int("limit", 0, "keep the first N images of each split (0: all)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: idx2imagefolder -out DIR [-data NAME] [-dir IDXDIR] [-limit N]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := data.IDXToImageFolder(ctx, *name, *dir, *out, *limit); err != nil {
		fmt.Fprintln(os.Stderr, "idx2imagefolder:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s as an ImageFolder in %s\n", *name, *out)
}
