package data

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// ImageFolderOptions says how the images of an ImageFolder (or a
// labels.csv set) are decoded. The zero value keeps every image's size
// (they must then all agree) and detects the channel count.
type ImageFolderOptions struct {
	// Transform brings images to one size (torchvision's image_size); see
	// [Transform].
	Transform Transform
	// Channels is 1 or 3 to force grayscale or RGB, or 0 to detect: one
	// channel when every image of both splits is grayscale, else RGB.
	// With Channels set and a Transform size, opening reads no image at
	// all (fast for large sets; a bad file then shows at Read).
	Channels int
}

func (o ImageFolderOptions) validate() error {
	if o.Channels != 0 && o.Channels != 1 && o.Channels != 3 {
		return fmt.Errorf("data: channels = %d: want 1 (grayscale), 3 (RGB) or 0 (detect)", o.Channels)
	}
	if o.Transform.H < 0 || o.Transform.W < 0 || (o.Transform.H == 0) != (o.Transform.W == 0) {
		return fmt.Errorf("data: image size %d×%d: want both H and W > 0, or neither", o.Transform.H, o.Transform.W)
	}
	return nil
}

// imageExts are the extensions decoded here, and otherExts the rest of
// torchvision's IMG_EXTENSIONS: a file with one of those is an error
// rather than skipped, since torchvision would have loaded it and the two
// data sets would silently differ. Other files are skipped, as
// torchvision skips them. Extensions match case-insensitively.
var (
	imageExts = []string{".jpeg", ".jpg", ".png"}
	otherExts = []string{".bmp", ".pgm", ".ppm", ".tif", ".tiff", ".webp"}
)

// imageFile is one image found on disk.
type imageFile struct {
	path string
	size int64
}

// imageSet is the decoding half shared by the file-based sources: a list
// of image files and the shape they are decoded to. Immutable once built.
type imageSet struct {
	name    string
	files   []imageFile
	c, h, w int
	t       Transform
}

func (s *imageSet) info(classes int, names []string) Info {
	return Info{Name: s.name, N: len(s.files), C: s.c, H: s.h, W: s.w, Classes: classes, ClassNames: names}
}

// read decodes image i into dst, (c, h, w). Safe for concurrent use.
func (s *imageSet) read(i int, dst []uint8) error {
	p := s.files[i].path
	img, err := decodeImage(p)
	if err != nil {
		return err
	}
	pix, h, w := planar(img, s.c)
	if !s.t.enabled() && (h != s.h || w != s.w) {
		return fmt.Errorf("data: %s: image is %d×%d, the set's images are %d×%d (did the file change?)", p, h, w, s.h, s.w)
	}
	s.t.apply(dst, pix, s.c, h, w)
	return nil
}

// shapeOf decides the decoded shape of the images of sets (both splits of
// one data set, so that they agree), reading each file's header unless
// both the channels and the size are given. Headers are read by a pool of
// GOMAXPROCS goroutines, joined before it returns; errors are reported for
// the first bad file in order, so the message does not depend on timing.
func shapeOf(ctx context.Context, opt ImageFolderOptions, sets ...[]imageFile) (c, h, w int, err error) {
	c, h, w = opt.Channels, opt.Transform.H, opt.Transform.W
	if c != 0 && opt.Transform.enabled() {
		return c, h, w, nil
	}
	var files []imageFile
	for _, s := range sets {
		files = append(files, s...)
	}
	cfgs := make([]image.Config, len(files))
	errs := make([]error, len(files))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(files)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(files); i = int(next.Add(1) - 1) {
				if err := ctx.Err(); err != nil {
					errs[i] = err
					return
				}
				cfgs[i], errs[i] = probeImage(files[i].path)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, 0, 0, err
		}
	}
	gray := true
	for i, cfg := range cfgs {
		gray = gray && isGray(cfg.ColorModel)
		if opt.Transform.enabled() {
			continue
		}
		if i == 0 {
			h, w = cfg.Height, cfg.Width
		} else if cfg.Height != h || cfg.Width != w {
			return 0, 0, 0, fmt.Errorf("data: images differ in size and no image size is set: %s is %d×%d (H×W) but %s is %d×%d; set image_size [H, W] to resize and centre-crop them",
				files[0].path, h, w, files[i].path, cfg.Height, cfg.Width)
		}
	}
	if c == 0 {
		c = 3
		if gray {
			c = 1
		}
	}
	return c, h, w, nil
}

// fingerprint identifies a set's files and decoding for the statistics
// cache: it changes when a file is added, removed, renamed or changes
// size, or when the decoded shape changes.
func (s *imageSet) fingerprint(root string) string {
	h := sha256.New()
	var b [8]byte
	for _, v := range []int{s.c, s.h, s.w, s.t.H, s.t.W, len(s.files)} {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	for _, f := range s.files {
		rel, err := filepath.Rel(root, f.path)
		if err != nil {
			rel = f.path
		}
		h.Write([]byte(filepath.ToSlash(rel)))
		h.Write([]byte{0})
		binary.LittleEndian.PutUint64(b[:], uint64(f.size))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// maxWalkDepth bounds the folders below a class folder, so that a symbolic
// link cycle ends in an error rather than a hang.
const maxWalkDepth = 32

// classFiles lists the image files under dir, recursively and following
// symbolic links, in torchvision's order: folders sorted by path, the
// files of each sorted by name.
func classFiles(ctx context.Context, dir string) ([]imageFile, error) {
	type folder struct {
		path  string
		files []imageFile
	}
	var folders []folder
	var walk func(d string, depth int) error
	walk = func(d string, depth int) error {
		if depth > maxWalkDepth {
			return fmt.Errorf("data: %s: folders nested more than %d deep (a symbolic link loop?)", d, maxWalkDepth)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		fo := folder{path: d}
		var subs []string
		for _, e := range entries {
			p := filepath.Join(d, e.Name())
			fi, err := os.Stat(p) // follows links, as os.walk(followlinks=True)
			if err != nil {
				return fmt.Errorf("data: %w", err)
			}
			if fi.IsDir() {
				subs = append(subs, p)
				continue
			}
			ext := strings.ToLower(filepath.Ext(e.Name()))
			switch {
			case slices.Contains(imageExts, ext):
				fo.files = append(fo.files, imageFile{path: p, size: fi.Size()})
			case slices.Contains(otherExts, ext):
				return fmt.Errorf("data: %s: %s images are not supported (only PNG and JPEG); convert it, or move it out of the data set", p, ext)
			}
		}
		folders = append(folders, fo)
		for _, s := range subs {
			if err := walk(s, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(dir, 0); err != nil {
		return nil, err
	}
	// Python sorts os.walk's (root, dirs, files) tuples by root string.
	slices.SortFunc(folders, func(a, b folder) int { return strings.Compare(a.path, b.path) })
	var out []imageFile
	for _, f := range folders {
		out = append(out, f.files...) // ReadDir sorts by name already
	}
	return out, nil
}

// classFolders returns the sorted names of the sub-folders of dir (links
// to folders included): torchvision's find_classes.
func classFolders(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	var names []string
	for _, e := range entries {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if fi.IsDir() {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("data: %s has no class folders: want %s/<class>/<image>.{png,jpg,jpeg}", dir, dir)
	}
	return names, nil // ReadDir sorts by name, byte-wise, which is code-point order as Python's sorted
}

// ImageFolder is one split of a data set in torchvision's ImageFolder
// layout, as a [Source]: images are decoded from disk on every Read.
// Immutable and safe for concurrent use.
type ImageFolder struct {
	root   string
	set    imageSet
	labels []int32
	names  []string
}

// OpenImageFolder opens the train and test splits of the ImageFolder at
// dir:
//
//	dir/train/<class>/**/*.{png,jpg,jpeg}
//	dir/test/<class>/…   (or dir/val/… when there is no dir/test)
//
// Classes are the sorted names of train's sub-folders (torchvision's
// find_classes, hidden folders included, as there), indexed 0, 1, …; the
// test split uses the same indices, and a test class that train lacks is an
// error (train may have classes test lacks). Files are taken in
// torchvision's order — folders sorted by path, recursively, following
// links, then file names sorted — so example i is torchvision's sample i.
// Files without an image extension are skipped, as torchvision skips
// them; .bmp, .ppm, .tif and the other image types torchvision would load
// but this package does not decode are an error, as is a class folder with
// no image. Images decode as described at [ImageFolderOptions] and
// [Transform].
func OpenImageFolder(ctx context.Context, dir string, opt ImageFolderOptions) (train, test *ImageFolder, err error) {
	if err := opt.validate(); err != nil {
		return nil, nil, err
	}
	trainDir := filepath.Join(dir, "train")
	testDir, err := testSplitDir(dir)
	if err != nil {
		return nil, nil, err
	}
	names, err := classFolders(trainDir)
	if err != nil {
		return nil, nil, err
	}
	testNames, err := classFolders(testDir)
	if err != nil {
		return nil, nil, err
	}
	index := make(map[string]int32, len(names))
	for i, n := range names {
		index[n] = int32(i)
	}
	for _, n := range testNames {
		if _, ok := index[n]; !ok {
			return nil, nil, fmt.Errorf("data: test class %q (%s) is not a class of the training split %s; its classes are %s",
				n, filepath.Join(testDir, n), trainDir, quoteList(names, 10))
		}
	}
	list := func(split string, classes []string) ([]imageFile, []int32, error) {
		var files []imageFile
		var labels []int32
		for _, n := range classes {
			cd := filepath.Join(split, n)
			found, err := classFiles(ctx, cd)
			if err != nil {
				return nil, nil, err
			}
			if len(found) == 0 {
				return nil, nil, fmt.Errorf("data: class folder %s has no PNG or JPEG image (torchvision raises for an empty class too)", cd)
			}
			files = append(files, found...)
			for range found {
				labels = append(labels, index[n])
			}
		}
		return files, labels, nil
	}
	trFiles, trLabels, err := list(trainDir, names)
	if err != nil {
		return nil, nil, err
	}
	teFiles, teLabels, err := list(testDir, testNames)
	if err != nil {
		return nil, nil, err
	}
	c, h, w, err := shapeOf(ctx, opt, trFiles, teFiles)
	if err != nil {
		return nil, nil, err
	}
	mk := func(d string, files []imageFile, labels []int32) *ImageFolder {
		return &ImageFolder{
			root:   dir,
			set:    imageSet{name: d, files: files, c: c, h: h, w: w, t: opt.Transform},
			labels: labels,
			names:  names,
		}
	}
	return mk(trainDir, trFiles, trLabels), mk(testDir, teFiles, teLabels), nil
}

// testSplitDir returns dir/test, or dir/val when there is no dir/test.
func testSplitDir(dir string) (string, error) {
	for _, n := range []string{"test", "val"} {
		p := filepath.Join(dir, n)
		fi, err := os.Stat(p)
		if err == nil && fi.IsDir() {
			return p, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("data: %w", err)
		}
	}
	return "", fmt.Errorf("data: %s has neither a test nor a val folder: want %s/test/<class>/… (or val) beside %s/train/<class>/…", dir, dir, dir)
}

func quoteList(names []string, most int) string {
	var b strings.Builder
	for i, n := range names {
		if i == most {
			fmt.Fprintf(&b, ", … (%d in all)", len(names))
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", n)
	}
	return b.String()
}

// Info returns the split's size, decoded shape and classes.
func (f *ImageFolder) Info() Info { return f.set.info(len(f.names), f.names) }

// Label returns example i's class index.
func (f *ImageFolder) Label(i int) int32 { return f.labels[i] }

// Path returns example i's file.
func (f *ImageFolder) Path(i int) string { return f.set.files[i].path }

// Read decodes example i into dst (see [Pixels]).
func (f *ImageFolder) Read(i int, dst []uint8) error {
	checkRead("ImageFolder", f.Info(), i, dst)
	return f.set.read(i, dst)
}

// Fingerprint identifies the split's file list, file sizes and decoded
// shape, for [CachedChannelStats].
func (f *ImageFolder) Fingerprint() string { return f.set.fingerprint(f.root) }
