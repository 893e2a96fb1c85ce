package data

import (
	"context"
	"fmt"
	"math/rand/v2"
)

// CodeSetSide is the side of the code set's grayscale images.
const CodeSetSide = 8

// WriteCodeSet writes a synthetic, linearly separable ImageFolder of any
// number of classes into dir: 1×8×8 grayscale PNGs, perClass training
// images and one test image per class, class folders zero-padded numbers
// (so sorted order is label order). Class k's image is a binary code of k
// — pixel p is bright when bit p mod b of k is set, with b = 9 up to 512
// classes, else 12 — plus uniform noise, so a linear model can learn every
// class. It is the test set for label spaces wider than a byte (the
// learnable colour set, [WriteColorSet], has 100).
func WriteCodeSet(ctx context.Context, dir string, classes, perClass int, seed uint64) error {
	bits := 9
	if classes > 1<<9 {
		bits = 12
	}
	if classes < 1 || classes > 1<<bits || perClass < 1 {
		return fmt.Errorf("data: code set: %d classes and %d images per class; want 1..%d classes and at least 1 image", classes, perClass, 1<<12)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const px = CodeSetSide * CodeSetSide
	for _, split := range []struct {
		name string
		per  int
	}{{"train", perClass}, {"test", 1}} {
		n := classes * split.per
		pix, labels := make([]uint8, n*px), make([]int32, n)
		for i := range n {
			k := i / split.per
			labels[i] = int32(k)
			for p := range px {
				v := 40 + rng.IntN(30)
				if k>>(p%bits)&1 == 1 {
					v += 150
				}
				pix[i*px+p] = uint8(v)
			}
		}
		if err := WriteImageFolder(ctx, dir, split.name, pix, labels, n, 1, CodeSetSide, CodeSetSide, classes); err != nil {
			return err
		}
	}
	return nil
}
