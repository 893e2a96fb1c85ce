package data

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
)

// WriteImageFolder writes n images as PNG files in ImageFolder layout,
// dir/<split>/<class>/<index>.png: pix is (n, c, h, w) planar (c is 1 for
// grayscale PNGs, 3 for RGB), labels[i] < classes is image i's class.
// Class folders and file names are zero-padded numbers ("0" … "9", or "00"
// … "99"; "00042.png"), so that their sorted order — the order
// [OpenImageFolder] indexes classes and files in — is label order and
// image order. Classes without an image get no folder.
func WriteImageFolder[L uint8 | int32](ctx context.Context, dir, split string, pix []uint8, labels []L, n, c, h, w, classes int) error {
	if c != 1 && c != 3 {
		return fmt.Errorf("data: WriteImageFolder: %d channels: want 1 or 3", c)
	}
	if len(pix) != n*c*h*w || len(labels) != n {
		return fmt.Errorf("data: WriteImageFolder: %d images of %d×%d×%d need %d pixel bytes and %d labels, got %d and %d",
			n, c, h, w, n*c*h*w, n, len(pix), len(labels))
	}
	classWidth, fileWidth := len(fmt.Sprint(max(classes-1, 0))), len(fmt.Sprint(max(n-1, 0)))
	made := map[L]bool{}
	plane := h * w
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := labels[i]
		if l < 0 || int(l) >= classes {
			return fmt.Errorf("data: WriteImageFolder: label %d of image %d is out of range [0, %d)", l, i, classes)
		}
		cd := filepath.Join(dir, split, fmt.Sprintf("%0*d", classWidth, l))
		if !made[l] {
			if err := os.MkdirAll(cd, 0o755); err != nil {
				return fmt.Errorf("data: %w", err)
			}
			made[l] = true
		}
		src := pix[i*c*plane : (i+1)*c*plane]
		var img image.Image
		if c == 1 {
			g := image.NewGray(image.Rect(0, 0, w, h))
			copy(g.Pix, src)
			img = g
		} else {
			m := image.NewNRGBA(image.Rect(0, 0, w, h))
			for o := range plane {
				m.Pix[4*o], m.Pix[4*o+1], m.Pix[4*o+2], m.Pix[4*o+3] = src[o], src[plane+o], src[2*plane+o], 255
			}
			img = m
		}
		if err := writePNG(filepath.Join(cd, fmt.Sprintf("%0*d.png", fileWidth, i)), img); err != nil {
			return err
		}
	}
	return nil
}

func writePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("data: %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	return nil
}

// IDXToImageFolder converts an IDX data set (MNIST, Fashion-MNIST or any
// folder of the four IDX files) into an ImageFolder of grayscale PNGs at
// outDir/train and outDir/test (see [WriteImageFolder]; 10 classes, folders
// "0" … "9"). name and idxDir find the files as [Load] does: "mnist" and
// "fashion-mnist" look in their usual places when idxDir is empty, and any
// name with idxDir reads that folder. limit, if > 0, keeps the first limit
// images of each split.
func IDXToImageFolder(ctx context.Context, name, idxDir, outDir string, limit int) error {
	var files idxFiles
	var err error
	switch strings.ToLower(name) {
	case MNIST:
		files, err = findMNIST(ctx, idxDir)
	case FashionMNIST:
		files, err = findFashionMNIST(idxDir)
	default:
		if idxDir == "" {
			return fmt.Errorf("data: IDXToImageFolder: %q is not %s or %s, so the folder of its IDX files must be given", name, MNIST, FashionMNIST)
		}
		var why string
		if files, why = findIn(idxDir); why != "" {
			err = &NotFoundError{Name: name, Looked: []string{why}, Hint: dirHint}
		}
	}
	if err != nil {
		return err
	}
	for _, s := range []struct{ split, images, labels string }{
		{"train", files.trainImages, files.trainLabels},
		{"test", files.testImages, files.testLabels},
	} {
		sp, err := readSplit(ctx, s.images, s.labels)
		if err != nil {
			return err
		}
		n := sp.n
		if limit > 0 {
			n = min(n, limit)
		}
		if err := WriteImageFolder(ctx, outDir, s.split, sp.pix[:n*sp.h*sp.w], sp.labels[:n], n, 1, sp.h, sp.w, 10); err != nil {
			return err
		}
	}
	return nil
}
