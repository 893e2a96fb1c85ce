// Command colorset writes gradsync's synthetic colour set (data.ColorSet)
// in CIFAR-100's binary layout, for training tests and experiments that
// need colour images without downloading CIFAR:
//
//	go run ./scripts/colorset -out /tmp/colorset -train 10000 -test 2000 -seed 1
//
// The folder then opens as CIFAR-100 (data.OpenCIFAR100), with 100 fine
// classes (a shape in a hue) and 20 coarse ones (the hue).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gradsync/gradsync/data"
)

func main() {
	out := flag.String("out", "", "folder to write train.bin, test.bin and the label name files into (required)")
	nTrain := flag.Int("train", 10000, "training records")
	nTest := flag.Int("test", 2000, "test records")
	seed := flag.Int64("seed", 1, "seed of the set")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: colorset -out DIR [-train N] [-test N] [-seed S]")
		os.Exit(2)
	}
	if err := data.WriteColorSet(*out, *nTrain, *nTest, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "colorset:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d training and %d test records to %s (CIFAR-100 binary layout)\n", *nTrain, *nTest, *out)
}
