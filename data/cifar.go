package data

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// CIFAR image geometry: 3 planes (R, G, B) of 32 rows of 32 bytes, as the
// official binary records store them.
const (
	CIFARSide   = 32
	cifarPixels = 3 * CIFARSide * CIFARSide // 3072
)

// CIFARLabels chooses which of a CIFAR-100 record's labels a source gives.
type CIFARLabels int

const (
	// Fine is CIFAR-100's 100 classes (the second label byte).
	Fine CIFARLabels = iota
	// Coarse is CIFAR-100's 20 superclasses (the first label byte).
	Coarse
)

func (l CIFARLabels) String() string {
	switch l {
	case Fine:
		return "fine"
	case Coarse:
		return "coarse"
	}
	return fmt.Sprintf("CIFARLabels(%d)", int(l))
}

// cifarFormat is one of the two official binary layouts: records of
// len(classes) label bytes followed by 3072 pixel bytes.
type cifarFormat struct {
	name    string
	classes []int // the label bytes' ranges, in record order
}

var (
	cifar10Format  = cifarFormat{name: "cifar10", classes: []int{10}}
	cifar100Format = cifarFormat{name: "cifar100", classes: []int{20, 100}} // coarse, fine
)

func (f cifarFormat) recordLen() int { return len(f.classes) + cifarPixels }

// readCIFARLabels reads the records of one CIFAR binary file from r and
// returns each record's label bytes, labels[k][i] for label byte k of record
// i. size is the file's length, or −1 if unknown. It checks that the input
// is a whole, non-zero number of records and that every label is in range;
// errors name the file (name) and the record.
func readCIFARLabels(r io.Reader, size int64, f cifarFormat, name string) ([][]uint8, error) {
	rl := int64(f.recordLen())
	if size >= 0 && (size == 0 || size%rl != 0) {
		return nil, fmt.Errorf("data: %s: %d bytes is not a whole number of %s records of %d bytes (%d label byte(s) + %d pixels)",
			name, size, f.name, rl, len(f.classes), cifarPixels)
	}
	labels := make([][]uint8, len(f.classes))
	if size >= 0 {
		for k := range labels {
			labels[k] = make([]uint8, 0, size/rl)
		}
	}
	br := bufio.NewReaderSize(r, 1<<20)
	rec := make([]byte, rl)
	for i := 0; ; i++ {
		n, err := io.ReadFull(br, rec)
		if err == io.EOF {
			if i == 0 {
				return nil, fmt.Errorf("data: %s: empty file: want %s records of %d bytes", name, f.name, rl)
			}
			return labels, nil
		}
		if err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("data: %s: %d bytes is not a whole number of %s records of %d bytes: the last record has %d",
				name, int64(i)*rl+int64(n), f.name, rl, n)
		}
		if err != nil {
			return nil, fmt.Errorf("data: %s: %w", name, err)
		}
		for k, c := range f.classes {
			if int(rec[k]) >= c {
				return nil, fmt.Errorf("data: %s: record %d (byte offset %d): label byte %d is %d, want < %d (is this a %s file?)",
					name, i, int64(i)*rl+int64(k), k, rec[k], c, f.name)
			}
			labels[k] = append(labels[k], rec[k])
		}
	}
}

// CIFAR is one split of CIFAR-10 or CIFAR-100 read from the official binary
// files as a [Source]. Labels are read when it is opened; pixels are read
// from the files by each Read (a positioned read of one record, safe from
// several goroutines), so the split is never held in memory. Close it when
// done.
type CIFAR struct {
	name    string
	format  cifarFormat
	paths   []string
	sizes   []int64
	files   []*os.File
	starts  []int // file k holds records starts[k] ≤ i < starts[k+1]
	labels  []uint8
	classes int
	names   []string
}

// OpenCIFAR10 opens CIFAR-10's binary version in dir (the folder
// cifar-10-batches-bin of the official tarball, or a folder holding it):
// data_batch_1.bin … data_batch_5.bin form the training split (50,000
// records, in that order) and test_batch.bin the test split. Each record is
// 1 label byte (0–9) and 3072 pixel bytes: 1024 R, 1024 G, 1024 B, each
// 32×32 row-major — the planar layout a [Source] reads out. Class names are
// read from batches.meta.txt when it is there.
func OpenCIFAR10(dir string) (train, test *CIFAR, err error) {
	dir = cifarDir(dir, "data_batch_1.bin", "cifar-10-batches-bin")
	var names []string
	if names, err = readClassNames(filepath.Join(dir, "batches.meta.txt"), 10); err != nil {
		return nil, nil, err
	}
	trainFiles := make([]string, 5)
	for i := range trainFiles {
		trainFiles[i] = filepath.Join(dir, fmt.Sprintf("data_batch_%d.bin", i+1))
	}
	return openCIFARSplits(cifar10Format, 0, names, trainFiles, []string{filepath.Join(dir, "test_batch.bin")})
}

// OpenCIFAR100 opens CIFAR-100's binary version in dir (the folder
// cifar-100-binary of the official tarball, or a folder holding it):
// train.bin (50,000 records) and test.bin (10,000). Each record is a coarse
// label byte (0–19), a fine label byte (0–99) and 3072 pixel bytes laid out
// as CIFAR-10's. labels chooses the granularity; class names are read from
// fine_label_names.txt or coarse_label_names.txt when present.
func OpenCIFAR100(dir string, labels CIFARLabels) (train, test *CIFAR, err error) {
	dir = cifarDir(dir, "train.bin", "cifar-100-binary")
	var byteIndex, classes int
	var namesFile string
	switch labels {
	case Fine:
		byteIndex, classes, namesFile = 1, 100, "fine_label_names.txt"
	case Coarse:
		byteIndex, classes, namesFile = 0, 20, "coarse_label_names.txt"
	default:
		return nil, nil, fmt.Errorf("data: cifar100: labels %v: want fine or coarse", labels)
	}
	names, err := readClassNames(filepath.Join(dir, namesFile), classes)
	if err != nil {
		return nil, nil, err
	}
	return openCIFARSplits(cifar100Format, byteIndex, names,
		[]string{filepath.Join(dir, "train.bin")}, []string{filepath.Join(dir, "test.bin")})
}

// cifarDir returns dir, or dir/sub when dir lacks marker but dir/sub has it
// (the folder the official tarball extracts to).
func cifarDir(dir, marker, sub string) string {
	if _, err := os.Stat(filepath.Join(dir, marker)); err != nil {
		if _, err := os.Stat(filepath.Join(dir, sub, marker)); err == nil {
			return filepath.Join(dir, sub)
		}
	}
	return dir
}

// readClassNames reads one class name per line (blank lines ignored), or
// returns nil if the file does not exist.
func readClassNames(path string, classes int) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	var names []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			names = append(names, l)
		}
	}
	if len(names) != classes {
		return nil, fmt.Errorf("data: %s: %d class names, want %d (one per line)", path, len(names), classes)
	}
	return names, nil
}

func openCIFARSplits(f cifarFormat, byteIndex int, names, trainFiles, testFiles []string) (train, test *CIFAR, err error) {
	train, err = openCIFAR(f, f.name+" train", byteIndex, names, trainFiles)
	if err != nil {
		return nil, nil, err
	}
	test, err = openCIFAR(f, f.name+" test", byteIndex, names, testFiles)
	if err != nil {
		train.Close()
		return nil, nil, err
	}
	return train, test, nil
}

func openCIFAR(f cifarFormat, name string, byteIndex int, names, paths []string) (_ *CIFAR, err error) {
	c := &CIFAR{name: name, format: f, paths: paths, classes: f.classes[byteIndex], names: names, starts: []int{0}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	for _, p := range paths {
		fh, err := os.Open(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("data: %s: %s is missing (want the official binary version's files: %s)", f.name, p, strings.Join(baseNames(paths), ", "))
			}
			return nil, fmt.Errorf("data: %w", err)
		}
		c.files = append(c.files, fh)
		fi, err := fh.Stat()
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		labels, err := readCIFARLabels(fh, fi.Size(), f, p)
		if err != nil {
			return nil, err
		}
		c.sizes = append(c.sizes, fi.Size())
		c.labels = append(c.labels, labels[byteIndex]...)
		c.starts = append(c.starts, len(c.labels))
	}
	return c, nil
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

// Close closes the split's files; a later Read is an error. It must not
// run concurrently with Read.
func (c *CIFAR) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files = nil
	return errors.Join(errs...)
}

// Info returns the split's size, shape (3×32×32) and classes.
func (c *CIFAR) Info() Info {
	return Info{Name: c.name, N: len(c.labels), C: 3, H: CIFARSide, W: CIFARSide, Classes: c.classes, ClassNames: c.names}
}

// Label returns example i's class (fine or coarse for CIFAR-100).
func (c *CIFAR) Label(i int) int32 { return int32(c.labels[i]) }

// Read reads example i's pixels into dst (see [Pixels]): the record's 3072
// pixel bytes as stored, which are already planar R, G, B.
func (c *CIFAR) Read(i int, dst []uint8) error {
	checkRead("CIFAR", c.Info(), i, dst)
	if c.files == nil {
		return fmt.Errorf("data: %s: Read after Close: %w", c.name, fs.ErrClosed)
	}
	k := 0
	for i >= c.starts[k+1] {
		k++
	}
	rl := int64(c.format.recordLen())
	off := int64(i-c.starts[k])*rl + int64(len(c.format.classes))
	if _, err := c.files[k].ReadAt(dst, off); err != nil {
		return fmt.Errorf("data: %s: reading record %d: %w", c.paths[k], i-c.starts[k], err)
	}
	return nil
}

// Fingerprint identifies the split's files (names and sizes), for
// [CachedChannelStats].
func (c *CIFAR) Fingerprint() string {
	h := sha256.New()
	h.Write([]byte(c.format.name))
	var b [8]byte
	for k, p := range c.paths {
		h.Write([]byte{0})
		h.Write([]byte(filepath.Base(p)))
		binary.LittleEndian.PutUint64(b[:], uint64(c.sizes[k]))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// EncodeCIFAR10 returns CIFAR-10 binary records: labels[i] (< 10) then
// image i's 3072 bytes of pix, which is (N, 3, 32, 32). Mismatched lengths
// or out-of-range labels are bugs in the caller and panic.
func EncodeCIFAR10(labels []uint8, pix []uint8) []byte {
	return encodeCIFAR(cifar10Format, [][]uint8{labels}, pix)
}

// EncodeCIFAR100 returns CIFAR-100 binary records: coarse[i] (< 20),
// fine[i] (< 100), then image i's 3072 bytes of pix, (N, 3, 32, 32).
func EncodeCIFAR100(coarse, fine []uint8, pix []uint8) []byte {
	return encodeCIFAR(cifar100Format, [][]uint8{coarse, fine}, pix)
}

func encodeCIFAR(f cifarFormat, labels [][]uint8, pix []uint8) []byte {
	n := len(labels[0])
	if len(pix) != n*cifarPixels {
		panic(fmt.Sprintf("data: Encode%s: %d labels need %d pixel bytes, got %d", f.name, n, n*cifarPixels, len(pix)))
	}
	var b bytes.Buffer
	b.Grow(n * f.recordLen())
	for i := range n {
		for k, c := range f.classes {
			if len(labels[k]) != n || int(labels[k][i]) >= c {
				panic(fmt.Sprintf("data: Encode%s: label byte %d of record %d is out of range [0, %d) or lengths differ", f.name, k, i, c))
			}
			b.WriteByte(labels[k][i])
		}
		b.Write(pix[i*cifarPixels : (i+1)*cifarPixels])
	}
	return b.Bytes()
}
