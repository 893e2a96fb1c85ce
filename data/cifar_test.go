package data

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// cifarPix returns n images whose bytes encode (image seed, byte index),
// so that a misplaced record or plane shows.
func cifarPix(n int, seed int) []uint8 {
	pix := make([]uint8, n*cifarPixels)
	for i := range n {
		for j := range cifarPixels {
			pix[i*cifarPixels+j] = uint8(7*(i+seed) + 13*j + j/1024)
		}
	}
	return pix
}

// writeCIFAR10 writes the six files of the official binary version with
// per[k] records in data_batch_{k+1}.bin and nTest in test_batch.bin. The
// bytes are written by hand, independently of EncodeCIFAR10, which the
// test checks against them. Labels are (global index) mod 10.
func writeCIFAR10(t *testing.T, dir string, per []int, nTest int) (trainPix, testPix []uint8) {
	t.Helper()
	rec := func(label int, img []uint8) []byte { return append([]byte{byte(label)}, img...) }
	i := 0
	for k, n := range per {
		var b []byte
		pix := cifarPix(n, i)
		for j := range n {
			b = append(b, rec((i+j)%10, pix[j*cifarPixels:(j+1)*cifarPixels])...)
		}
		i += n
		trainPix = append(trainPix, pix...)
		writeFile(t, dir, fmt.Sprintf("data_batch_%d.bin", k+1), b)
	}
	testPix = cifarPix(nTest, 1000)
	var b []byte
	for j := range nTest {
		b = append(b, rec(j%10, testPix[j*cifarPixels:(j+1)*cifarPixels])...)
	}
	writeFile(t, dir, "test_batch.bin", b)
	return trainPix, testPix
}

func TestCIFAR10(t *testing.T) {
	dir := t.TempDir()
	trainPix, testPix := writeCIFAR10(t, dir, []int{3, 1, 4, 1, 5}, 6)
	names := "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n"
	writeFile(t, dir, "batches.meta.txt", []byte(names))
	train, test, err := OpenCIFAR10(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer train.Close()
	defer test.Close()
	in := train.Info()
	if in.N != 14 || in.C != 3 || in.H != 32 || in.W != 32 || in.Classes != 10 || in.ClassNames[9] != "truck" || len(in.ClassNames) != 10 {
		t.Fatalf("train info = %+v", in)
	}
	for i := range in.N {
		if train.Label(i) != int32(i%10) {
			t.Fatalf("label %d = %d", i, train.Label(i))
		}
		if got := readAll(t, train, i); !bytes.Equal(got, trainPix[i*cifarPixels:(i+1)*cifarPixels]) {
			t.Fatalf("image %d differs", i)
		}
	}
	if test.Info().N != 6 || !bytes.Equal(readAll(t, test, 5), testPix[5*cifarPixels:]) || test.Label(5) != 5 {
		t.Fatalf("test split: %+v", test.Info())
	}
	closed, other, err := OpenCIFAR10(dir)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	other.Close()
	wantErr(t, closed.Read(0, make([]uint8, cifarPixels)), "cifar10 train", "after Close")
	// The encoder writes the same bytes as the hand-written file.
	labels := []uint8{0, 1, 2, 3, 4, 5}
	want, _ := os.ReadFile(filepath.Join(dir, "test_batch.bin"))
	if !bytes.Equal(EncodeCIFAR10(labels, testPix), want) {
		t.Error("EncodeCIFAR10 differs from the official layout")
	}
	// The tarball's folder is found from its parent, and the fingerprint
	// follows the file sizes.
	parent := t.TempDir()
	writeCIFAR10(t, filepath.Join(parent, "cifar-10-batches-bin"), []int{1, 1, 1, 1, 1}, 1)
	tr2, te2, err := OpenCIFAR10(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	defer te2.Close()
	if tr2.Info().N != 5 || tr2.Info().ClassNames != nil {
		t.Errorf("tarball folder: %+v", tr2.Info())
	}
	if tr2.Fingerprint() == train.Fingerprint() || train.Fingerprint() == test.Fingerprint() {
		t.Error("fingerprints of different files agree")
	}
}

func TestCIFARConcurrentRead(t *testing.T) {
	dir := t.TempDir()
	trainPix, _ := writeCIFAR10(t, dir, []int{5, 5, 5, 5, 5}, 1)
	train, test, err := OpenCIFAR10(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer train.Close()
	defer test.Close()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for g := range 4 {
		wg.Go(func() {
			dst := make([]uint8, cifarPixels)
			for i := g; i < 25; i += 2 {
				if err := train.Read(i, dst); err != nil {
					errs[g] = err
					return
				}
				if !bytes.Equal(dst, trainPix[i*cifarPixels:(i+1)*cifarPixels]) {
					errs[g] = fmt.Errorf("image %d differs", i)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func writeCIFAR100(t *testing.T, dir string, nTrain, nTest int) (trainPix []uint8) {
	t.Helper()
	write := func(name string, n, seed int) []uint8 {
		pix := cifarPix(n, seed)
		var b []byte
		for j := range n {
			fine := (j*37 + seed) % 100
			b = append(b, byte(fine/5), byte(fine))
			b = append(b, pix[j*cifarPixels:(j+1)*cifarPixels]...)
		}
		writeFile(t, dir, name, b)
		return pix
	}
	trainPix = write("train.bin", nTrain, 0)
	write("test.bin", nTest, 3)
	return trainPix
}

func TestCIFAR100(t *testing.T) {
	dir := t.TempDir()
	trainPix := writeCIFAR100(t, dir, 7, 3)
	var fine, coarse []string
	for i := range 100 {
		fine = append(fine, fmt.Sprintf("fine%02d", i))
	}
	for i := range 20 {
		coarse = append(coarse, fmt.Sprintf("coarse%02d", i))
	}
	writeFile(t, dir, "fine_label_names.txt", []byte(strings.Join(fine, "\n")))
	writeFile(t, dir, "coarse_label_names.txt", []byte(strings.Join(coarse, "\n")+"\n"))
	for _, g := range []CIFARLabels{Fine, Coarse} {
		train, test, err := OpenCIFAR100(dir, g)
		if err != nil {
			t.Fatal(err)
		}
		in := train.Info()
		wantClasses, wantNames := 100, fine
		if g == Coarse {
			wantClasses, wantNames = 20, coarse
		}
		if in.N != 7 || in.Classes != wantClasses || !slices.Equal(in.ClassNames, wantNames) || in.C != 3 {
			t.Fatalf("%v: info = %+v", g, in)
		}
		for i := range 7 {
			want := int32(i * 37 % 100)
			if g == Coarse {
				want /= 5
			}
			if train.Label(i) != want {
				t.Errorf("%v: label %d = %d, want %d", g, i, train.Label(i), want)
			}
			if !bytes.Equal(readAll(t, train, i), trainPix[i*cifarPixels:(i+1)*cifarPixels]) {
				t.Errorf("%v: image %d differs", g, i)
			}
		}
		if test.Info().N != 3 || test.Label(0) != map[CIFARLabels]int32{Fine: 3, Coarse: 0}[g] {
			t.Errorf("%v: test %+v label %d", g, test.Info(), test.Label(0))
		}
		train.Close()
		test.Close()
	}
	// The encoder writes the official layout.
	want, _ := os.ReadFile(filepath.Join(dir, "train.bin"))
	var c, f []uint8
	for j := range 7 {
		f = append(f, uint8(j*37%100))
		c = append(c, uint8(j*37%100/5))
	}
	if !bytes.Equal(EncodeCIFAR100(c, f, trainPix), want) {
		t.Error("EncodeCIFAR100 differs from the official layout")
	}
}

func TestCIFARBadInput(t *testing.T) {
	t.Run("not whole records", func(t *testing.T) {
		dir := t.TempDir()
		writeCIFAR10(t, dir, []int{1, 1, 1, 1, 1}, 1)
		p := filepath.Join(dir, "data_batch_3.bin")
		b, _ := os.ReadFile(p)
		writeFile(t, dir, "data_batch_3.bin", b[:len(b)-1])
		_, _, err := OpenCIFAR10(dir)
		wantErr(t, err, p, "3072 bytes is not a whole number", "3073")
	})
	t.Run("cifar10 file read as cifar100", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "train.bin", EncodeCIFAR10([]uint8{1, 2}, cifarPix(2, 0)))
		writeFile(t, dir, "test.bin", EncodeCIFAR100([]uint8{1}, []uint8{2}, cifarPix(1, 0)))
		_, _, err := OpenCIFAR100(dir, Fine)
		wantErr(t, err, filepath.Join(dir, "train.bin"), "not a whole number")
	})
	t.Run("label out of range", func(t *testing.T) {
		dir := t.TempDir()
		b := EncodeCIFAR100([]uint8{1, 2}, []uint8{5, 10}, cifarPix(2, 0))
		b[cifarPixels+2] = 20 // record 1's coarse byte
		writeFile(t, dir, "train.bin", b)
		writeFile(t, dir, "test.bin", EncodeCIFAR100([]uint8{1}, []uint8{2}, cifarPix(1, 0)))
		_, _, err := OpenCIFAR100(dir, Coarse)
		wantErr(t, err, filepath.Join(dir, "train.bin"), "record 1", "is 20, want < 20")
	})
	t.Run("missing file", func(t *testing.T) {
		dir := t.TempDir()
		writeCIFAR10(t, dir, []int{1, 1, 1, 1, 1}, 1)
		os.Remove(filepath.Join(dir, "test_batch.bin"))
		_, _, err := OpenCIFAR10(dir)
		wantErr(t, err, filepath.Join(dir, "test_batch.bin"), "missing")
	})
	t.Run("empty file", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "train.bin", nil)
		writeFile(t, dir, "test.bin", nil)
		_, _, err := OpenCIFAR100(dir, Fine)
		wantErr(t, err, filepath.Join(dir, "train.bin"), "0 bytes")
	})
	t.Run("wrong number of class names", func(t *testing.T) {
		dir := t.TempDir()
		writeCIFAR10(t, dir, []int{1, 1, 1, 1, 1}, 1)
		writeFile(t, dir, "batches.meta.txt", []byte("a\nb\n"))
		_, _, err := OpenCIFAR10(dir)
		wantErr(t, err, "batches.meta.txt", "2 class names, want 10")
	})
	t.Run("bad granularity", func(t *testing.T) {
		_, _, err := OpenCIFAR100(t.TempDir(), CIFARLabels(7))
		wantErr(t, err, "CIFARLabels(7)")
	})
}

// FuzzCIFARRecords checks the record reader on arbitrary bytes: it never
// panics, it answers the same with and without the size known up front,
// and what it accepts is a whole number of records whose label bytes it
// returns, each in range.
func FuzzCIFARRecords(f *testing.F) {
	f.Add(EncodeCIFAR10([]uint8{3}, cifarPix(1, 0)), false)
	f.Add(EncodeCIFAR100([]uint8{3, 19}, []uint8{17, 99}, cifarPix(2, 0)), true)
	f.Add([]byte{}, true)
	f.Add([]byte{10}, false)
	f.Fuzz(func(t *testing.T, b []byte, hundred bool) {
		format := cifar10Format
		if hundred {
			format = cifar100Format
		}
		sized, err1 := readCIFARLabels(bytes.NewReader(b), int64(len(b)), format, "f")
		streamed, err2 := readCIFARLabels(bytes.NewReader(b), -1, format, "f")
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("sized err %v, streamed err %v", err1, err2)
		}
		if err1 != nil {
			if !strings.Contains(err1.Error(), "f:") || !strings.Contains(err2.Error(), "f:") {
				t.Fatalf("errors do not name the file: %v / %v", err1, err2)
			}
			return
		}
		rl := format.recordLen()
		n := len(b) / rl
		if n == 0 || n*rl != len(b) {
			t.Fatalf("accepted %d bytes for records of %d", len(b), rl)
		}
		for k, c := range format.classes {
			if len(sized[k]) != n || !slices.Equal(sized[k], streamed[k]) {
				t.Fatalf("label byte %d: %d labels (streamed %d) for %d records", k, len(sized[k]), len(streamed[k]), n)
			}
			for i, l := range sized[k] {
				if int(l) >= c || l != b[i*rl+k] {
					t.Fatalf("record %d label byte %d = %d (file byte %d), range %d", i, k, l, b[i*rl+k], c)
				}
			}
		}
	})
}
