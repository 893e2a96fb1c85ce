package data

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeFile writes data to dir/rel, creating folders.
func writeFile(t *testing.T, dir, rel string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func encodePNG(t *testing.T, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// rgbImage is an h×w opaque image whose pixel (x, y) is (base+x, base+y,
// base+x+y).
func rgbImage(h, w int, base uint8) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{base + uint8(x), base + uint8(y), base + uint8(x+y), 255})
		}
	}
	return img
}

func grayImage(h, w int, base uint8) *image.Gray {
	img := image.NewGray(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = base + uint8(i)
	}
	return img
}

func readAll(t *testing.T, src Pixels, i int) []uint8 {
	t.Helper()
	dst := make([]uint8, src.Info().ImageSize())
	if err := src.Read(i, dst); err != nil {
		t.Fatalf("Read(%d): %v", i, err)
	}
	return dst
}

func TestImageFolderLayout(t *testing.T) {
	dir := t.TempDir()
	// Classes out of creation order; a nested folder; a non-image file
	// (skipped, as torchvision skips it); upper-case extensions.
	writeFile(t, dir, "train/zebra/b.PNG", encodePNG(t, rgbImage(3, 4, 10)))
	writeFile(t, dir, "train/zebra/a.png", encodePNG(t, rgbImage(3, 4, 20)))
	writeFile(t, dir, "train/ant/x.png", encodePNG(t, rgbImage(3, 4, 30)))
	writeFile(t, dir, "train/ant/sub/y.png", encodePNG(t, rgbImage(3, 4, 40)))
	writeFile(t, dir, "train/ant/notes.txt", []byte("not an image"))
	writeFile(t, dir, "train/mole/m.png", encodePNG(t, grayImage(3, 4, 50))) // gray in an RGB set
	writeFile(t, dir, "val/zebra/v.png", encodePNG(t, rgbImage(3, 4, 60)))
	train, test, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := train.Info()
	if in.N != 5 || in.C != 3 || in.H != 3 || in.W != 4 || in.Classes != 3 || !slices.Equal(in.ClassNames, []string{"ant", "mole", "zebra"}) {
		t.Fatalf("train info = %+v", in)
	}
	var got []string
	var labels []int32
	for i := range in.N {
		rel, _ := filepath.Rel(dir, train.Path(i))
		got = append(got, filepath.ToSlash(rel))
		labels = append(labels, train.Label(i))
	}
	// torchvision's order: class folders sorted, then os.walk roots
	// sorted ("train/ant" before "train/ant/sub"), then names sorted
	// byte-wise ("b.PNG" after "a.png").
	want := []string{"train/ant/x.png", "train/ant/sub/y.png", "train/mole/m.png", "train/zebra/a.png", "train/zebra/b.PNG"}
	if !slices.Equal(got, want) || !slices.Equal(labels, []int32{0, 0, 1, 2, 2}) {
		t.Fatalf("files = %v labels %v, want %v [0 0 1 2 2]", got, labels, want)
	}
	// Planar R, G, B: pixel (x, y) of base b is (b+x, b+y, b+x+y).
	pix := readAll(t, train, 3) // zebra/a, base 20
	for y := range 3 {
		for x := range 4 {
			o := y*4 + x
			if pix[o] != uint8(20+x) || pix[12+o] != uint8(20+y) || pix[24+o] != uint8(20+x+y) {
				t.Fatalf("pixel (%d, %d) = %d %d %d", x, y, pix[o], pix[12+o], pix[24+o])
			}
		}
	}
	// The gray image is copied into all three planes.
	g := readAll(t, train, 2)
	for o := range 12 {
		if g[o] != uint8(50+o) || g[12+o] != g[o] || g[24+o] != g[o] {
			t.Fatalf("gray image in an RGB set: planes %v", g)
		}
	}
	if te := test.Info(); te.N != 1 || test.Label(0) != 2 || te.Classes != 3 || te.C != 3 {
		t.Errorf("val info = %+v, label %d", te, test.Label(0))
	}
}

func TestImageFolderGrayAndFormats(t *testing.T) {
	dir := t.TempDir()
	var jb bytes.Buffer
	if err := jpeg.Encode(&jb, grayImage(4, 4, 0), &jpeg.Options{Quality: 100}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "train/a/1.png", encodePNG(t, grayImage(4, 4, 100)))
	writeFile(t, dir, "train/b/2.JPEG", jb.Bytes())
	writeFile(t, dir, "test/a/3.png", encodePNG(t, grayImage(4, 4, 7)))
	train, test, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in := train.Info(); in.C != 1 || in.N != 2 || test.Info().C != 1 {
		t.Fatalf("all-gray set: train %+v test %+v, want 1 channel", in, test.Info())
	}
	if pix := readAll(t, test, 0); pix[0] != 7 || pix[15] != 22 {
		t.Errorf("gray pixels = %v", pix)
	}
	readAll(t, train, 1) // the JPEG decodes
	// RGBA with transparency and a paletted PNG make the set RGB.
	pal := image.NewPaletted(image.Rect(0, 0, 4, 4), color.Palette{color.RGBA{200, 10, 20, 255}})
	writeFile(t, dir, "train/b/3.png", encodePNG(t, pal))
	train, _, err = OpenImageFolder(context.Background(), dir, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if train.Info().C != 3 {
		t.Fatalf("a paletted image in the set: %d channels, want 3", train.Info().C)
	}
	if pix := readAll(t, train, 2); pix[0] != 200 || pix[16] != 10 || pix[32] != 20 {
		t.Errorf("paletted pixels = %v", pix)
	}
	// Forcing one channel gives PIL's luma.
	train, _, err = OpenImageFolder(context.Background(), dir, ImageFolderOptions{Channels: 1})
	if err != nil {
		t.Fatal(err)
	}
	if pix := readAll(t, train, 2); pix[0] != uint8((19595*200+38470*10+7471*20+1<<15)>>16) {
		t.Errorf("luma of a paletted pixel = %d", pix[0])
	}
}

func TestImageFolderTransform(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "train/a/wide.png", encodePNG(t, rgbImage(10, 20, 0)))
	writeFile(t, dir, "train/a/tall.png", encodePNG(t, rgbImage(30, 6, 0)))
	writeFile(t, dir, "train/b/same.png", encodePNG(t, rgbImage(5, 5, 3)))
	writeFile(t, dir, "test/b/small.png", encodePNG(t, rgbImage(2, 3, 0)))
	train, test, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{Transform: Transform{H: 5, W: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if in := train.Info(); in.H != 5 || in.W != 5 || in.C != 3 {
		t.Fatalf("info = %+v", in)
	}
	for i := range 3 {
		readAll(t, train, i)
	}
	readAll(t, test, 0) // upscaled
	// An image already 5×5 comes through unchanged.
	got := readAll(t, train, 2)
	want, _, _ := planar(rgbImage(5, 5, 3), 3)
	if !bytes.Equal(got, want) {
		t.Errorf("5×5 image through a 5×5 transform changed: %v", got)
	}
	// wide: 10×20 → Resize(5) gives 5×10 → centre crop columns
	// round((10−5)/2) = 2 … 6, the same as the reference pipeline.
	pix, h, w := planar(rgbImage(10, 20, 0), 3)
	rs := resizeBilinear(pix, 3, h, w, 5, 10)
	ref := make([]uint8, 3*5*5)
	for c := range 3 {
		for y := range 5 {
			copy(ref[(c*5+y)*5:(c*5+y+1)*5], rs[(c*5+y)*10+2:])
		}
	}
	// wide.png sorts after tall.png.
	if got := readAll(t, train, 1); !bytes.Equal(got, ref) {
		t.Errorf("wide image: %v, want %v", got, ref)
	}
}

// imageFolderErr opens dir and returns the error, failing if there is none.
func imageFolderErr(t *testing.T, dir string, opt ImageFolderOptions) error {
	t.Helper()
	_, _, err := OpenImageFolder(context.Background(), dir, opt)
	if err == nil {
		t.Fatal("OpenImageFolder succeeded, want an error")
	}
	return err
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

func TestImageFolderBadInput(t *testing.T) {
	good := encodePNG(t, rgbImage(4, 4, 0))
	base := func(t *testing.T) string {
		dir := t.TempDir()
		writeFile(t, dir, "train/a/1.png", good)
		writeFile(t, dir, "test/a/1.png", good)
		return dir
	}
	t.Run("truncated PNG header", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.png", good[:20])
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), p)
	})
	t.Run("truncated PNG data", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.png", good[:len(good)-20])
		train, _, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{})
		if err != nil {
			t.Fatal(err) // the header is intact: the problem shows at Read
		}
		err = train.Read(1, make([]uint8, train.Info().ImageSize()))
		wantErr(t, err, p, "decoding")
	})
	t.Run("JPEG with a wrong header", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.jpg", append([]byte{0xff, 0xd8, 0xff, 0x00, 0x13}, good...))
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), p)
	})
	t.Run("non-image with an image extension", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.jpeg", []byte("hello, world"))
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), p, "not a PNG or JPEG")
	})
	t.Run("non-image with an image extension at Read", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.jpeg", []byte("hello, world"))
		train, _, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{Channels: 3, Transform: Transform{H: 4, W: 4}})
		if err != nil {
			t.Fatal(err) // nothing is probed with channels and size set
		}
		wantErr(t, train.Read(1, make([]uint8, 48)), p, "not a PNG or JPEG")
	})
	t.Run("decompression bomb", func(t *testing.T) {
		dir := base(t)
		// The IHDR chunk (after the 8-byte signature and 8 bytes of length
		// and type) claims 20000×20000; its CRC is recomputed so that
		// only the size is wrong.
		b := append([]byte(nil), good...)
		binary.BigEndian.PutUint32(b[16:], 20000)
		binary.BigEndian.PutUint32(b[20:], 20000)
		binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
		p := writeFile(t, dir, "train/a/2.png", b)
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), p, "20000×20000", "at most")
		train, _, err := OpenImageFolder(context.Background(), dir, ImageFolderOptions{Channels: 3, Transform: Transform{H: 4, W: 4}})
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, train.Read(1, make([]uint8, 48)), p, "at most")
	})
	t.Run("unsupported image type", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "train/a/2.bmp", []byte("BM"))
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), p, "not supported")
	})
	t.Run("empty class folder", func(t *testing.T) {
		dir := base(t)
		writeFile(t, dir, "train/b/readme.txt", []byte("x"))
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), filepath.Join(dir, "train", "b"), "no PNG or JPEG")
	})
	t.Run("test class missing from train", func(t *testing.T) {
		dir := base(t)
		writeFile(t, dir, "test/zz/1.png", good)
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), `"zz"`, "not a class of the training split")
	})
	t.Run("mixed sizes without image size", func(t *testing.T) {
		dir := base(t)
		p := writeFile(t, dir, "test/a/2.png", encodePNG(t, rgbImage(5, 4, 0)))
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), filepath.Join(dir, "train", "a", "1.png"), p, "4×4", "5×4", "image_size")
	})
	t.Run("no test split", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "train/a/1.png", good)
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), "neither a test nor a val")
	})
	t.Run("no class folders", func(t *testing.T) {
		dir := base(t)
		os.RemoveAll(filepath.Join(dir, "train"))
		writeFile(t, dir, "train/loose.png", good)
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{}), "no class folders")
	})
	t.Run("bad options", func(t *testing.T) {
		dir := base(t)
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{Channels: 2}), "channels = 2")
		wantErr(t, imageFolderErr(t, dir, ImageFolderOptions{Transform: Transform{H: 3}}), "3×0")
	})
}

func TestImageFolderCancelled(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "train/a/1.png", encodePNG(t, grayImage(2, 2, 0)))
	writeFile(t, dir, "test/a/1.png", encodePNG(t, grayImage(2, 2, 0)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := OpenImageFolder(ctx, dir, ImageFolderOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("OpenImageFolder with a cancelled context: %v", err)
	}
	if _, _, err := OpenLabelsCSV(ctx, dir, ImageFolderOptions{}); err == nil {
		t.Error("OpenLabelsCSV without labels.csv succeeded")
	}
}
