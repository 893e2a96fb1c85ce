package checkpoint

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTwoWritersOfOneFolder: a checkpoint being written (a Writer, its
// temporary folder claimed) survives another writer's Save in the same
// folder — which removes what crashed writers left — and commits. This
// is an elastic job's generation change: an old rank 0, evicted or slow
// to stop, writes its checkpoint at stop while the new generation's rank
// 0 on another worker writes the next. Before the temporary folders were
// claimed, the Save removed the Writer's folder and its Commit failed.
func TestTwoWritersOfOneFolder(t *testing.T) {
	dir := t.TempDir()
	st := small(50)
	w := smallWriter(t, dir, st)
	if _, err := Save(dir, small(40), 0); err != nil {
		t.Fatal(err)
	}
	for n, ten := range st.Tensors {
		if err := w.Put(ModelFile, n, ten); err != nil {
			t.Fatal(err)
		}
	}
	for n, ten := range st.Optim {
		if err := w.Put(OptimFile, n, ten); err != nil {
			t.Fatal(err)
		}
	}
	path, err := w.Commit(nil, 0)
	if err != nil {
		t.Fatalf("the Writer's checkpoint after another writer's Save: %v", err)
	}
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, dir), []string{"ckpt-40", "ckpt-50"}; !slices.Equal(got, want) {
		t.Errorf("folder holds %v, want %v (the claims released)", got, want)
	}
}

// TestCrashedWritersLeftovers: a temporary folder whose lock file nobody
// holds (its writer crashed), a lock file without its folder, and a
// folder without a lock file (a writer of before the locks) all go at
// the next Save; a Writer's claimed folder stays until it is aborted.
func TestCrashedWritersLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{".tmp-ckpt-7-1", ".tmp-ckpt-8-2", ".trash-ckpt-3"} {
		if err := os.Mkdir(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{".tmp-ckpt-7-1.lock", ".tmp-ckpt-9-3.lock"} {
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w := smallWriter(t, dir, small(20))
	if _, err := Save(dir, small(10), 0); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, dir), []string{filepath.Base(w.tmp), filepath.Base(w.tmp) + lockSuffix, "ckpt-10"}; !slices.Equal(got, want) {
		t.Fatalf("after a Save beside a Writer: %v, want %v", got, want)
	}
	w.Abort()
	if got, want := names(t, dir), []string{"ckpt-10"}; !slices.Equal(got, want) {
		t.Errorf("after the Writer's Abort: %v, want %v", got, want)
	}
}

// smallWriter starts a Writer of st in dir.
func smallWriter(t *testing.T, dir string, st *State) *Writer {
	t.Helper()
	w, err := NewWriter(dir, st.Meta, nil, specs(st.Tensors), specs(st.Optim))
	if err != nil {
		t.Fatal(err)
	}
	return w
}
