package data

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestIDXToImageFolder converts a small IDX set and reads it back: every
// PNG holds its IDX image's bytes, in the class its label names.
func TestIDXToImageFolder(t *testing.T) {
	ctx := context.Background()
	idx := writeIDXDir(t, 23, true, "t10k")
	out := t.TempDir()
	if err := IDXToImageFolder(ctx, "", idx, out, 0); err != nil {
		t.Fatal(err)
	}
	raw, err := readSplit(ctx, filepath.Join(idx, "train-images-idx3-ubyte.gz"), filepath.Join(idx, "train-labels-idx1-ubyte.gz"))
	if err != nil {
		t.Fatal(err)
	}
	train, test, err := OpenImageFolder(ctx, out, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := train.Info()
	if in.N != 23 || in.C != 1 || in.H != 2 || in.W != 3 || in.Classes != 10 || in.ClassNames[3] != "3" || test.Info().N != 2 {
		t.Fatalf("info %+v, test %+v", in, test.Info())
	}
	for i := range in.N {
		orig, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(train.Path(i)), ".png"))
		if err != nil {
			t.Fatal(err)
		}
		if train.Label(i) != int32(raw.labels[orig]) || !bytes.Equal(readAll(t, train, i), raw.pix[orig*6:(orig+1)*6]) {
			t.Errorf("%s: label %d, pixels %v; IDX image %d has label %d, pixels %v",
				train.Path(i), train.Label(i), readAll(t, train, i), orig, raw.labels[orig], raw.pix[orig*6:(orig+1)*6])
		}
	}
	// limit keeps the first images of each split.
	out2 := t.TempDir()
	if err := IDXToImageFolder(ctx, "fashion-mnist", idx, out2, 12); err != nil {
		t.Fatal(err)
	}
	tr2, _, err := OpenImageFolder(ctx, out2, ImageFolderOptions{})
	if err != nil || tr2.Info().N != 12 {
		t.Fatalf("limit 12: %v, %+v", err, tr2)
	}
	if _, err := os.Stat(filepath.Join(out2, "train", "0", "00.png")); err != nil {
		t.Error(err)
	}
	wantErr(t, IDXToImageFolder(ctx, "digits", "", out2, 0), "must be given")
	wantErr(t, IDXToImageFolder(ctx, "digits", t.TempDir(), out2, 0), "missing")
}

func TestWriteImageFolderRGB(t *testing.T) {
	ctx := context.Background()
	_, fine, pix := ColorSet(12, 2, false)
	dir := t.TempDir()
	// Fine labels 0..99 over 100 classes; the test split reuses a class of
	// train so that the folder opens.
	if err := WriteImageFolder(ctx, dir, "train", pix, fine, 12, 3, 32, 32, 100); err != nil {
		t.Fatal(err)
	}
	if err := WriteImageFolder(ctx, dir, "val", pix[:cifarPixels], fine[:1], 1, 3, 32, 32, 100); err != nil {
		t.Fatal(err)
	}
	train, _, err := OpenImageFolder(ctx, dir, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in := train.Info(); in.C != 3 || in.N != 12 || len(in.ClassNames[0]) != 2 {
		t.Fatalf("info %+v", in)
	}
	for i := range 12 {
		orig, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(train.Path(i)), ".png"))
		if !bytes.Equal(readAll(t, train, i), pix[orig*cifarPixels:(orig+1)*cifarPixels]) {
			t.Fatalf("image %d differs after a PNG round trip", orig)
		}
	}
	wantErr(t, WriteImageFolder(ctx, dir, "x", pix[:10], fine[:1], 1, 3, 32, 32, 100), "need 3072 pixel bytes")
	wantErr(t, WriteImageFolder(ctx, dir, "x", pix[:cifarPixels], []uint8{200}, 1, 3, 32, 32, 100), "out of range")
	wantErr(t, WriteImageFolder(ctx, dir, "x", pix[:cifarPixels], fine[:1], 1, 2, 32, 48, 100), "2 channels")
}
