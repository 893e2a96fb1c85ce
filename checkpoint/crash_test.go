package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gradsync/gradsync/models"
)

// helperEnv carries the checkpoint dir to TestHelperWriter in a child
// process.
const helperEnv = "GRADSYNC_CHECKPOINT_CRASH_DIR"

// crashKeep is the writer's keep.
const crashKeep = 2

// crashPattern is the bulk of crashState's tensors, built once per
// process so that the writer spends its time in Save.
var crashPattern = sync.OnceValue(func() (w [2][]byte) {
	a := make([]float32, 1<<20)
	b := make([]float32, 1<<19)
	for i := range a {
		a[i] = float32(i%4096) / 4096
	}
	for i := range b {
		b[i] = -float32(i%1024) / 1024
	}
	return [2][]byte{models.F32Tensor([]int{len(a)}, a).Data, models.F32Tensor([]int{len(b)}, b).Data}
})

// crashState is the checkpoint the writer saves at step: about 6 MB, the
// step stamped into every tensor, so a reader can tell the checkpoint of
// one step from any other.
func crashState(step int64) *State {
	p := crashPattern()
	w, m := bytes.Clone(p[0]), bytes.Clone(p[1])
	binary.LittleEndian.PutUint64(w, uint64(step))
	binary.LittleEndian.PutUint64(m[len(m)-8:], uint64(step))
	return &State{
		Meta:    Meta{JobID: "crash", Step: step, Epoch: int(step / 10), EpochConsumed: step % 10 * 64, WorldSize: 2, Seed: 1},
		Tensors: map[string]Tensor{"fc.weight": {DType: "F32", Shape: []int{1024, 1024}, Data: w}, "fc.bias": models.F32Tensor([]int{1}, []float32{float32(step)})},
		Optim:   map[string]Tensor{"momentum_buffer.fc.weight": {DType: "F32", Shape: []int{512, 1024}, Data: m}},
		Extra:   map[string]Tensor{"compress.step": {DType: "I64", Shape: []int{}, Data: binary.LittleEndian.AppendUint64(nil, uint64(step))}},
	}
}

// TestHelperWriter is not a test: TestCrashSafety runs the test binary
// again with helperEnv set, and then this resumes from the dir's latest
// checkpoint and saves step after step, printing "begin N" before and
// "saved N" after each Save, until it is killed.
func TestHelperWriter(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("the writer process of TestCrashSafety")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(2)
	}
	var step int64
	switch s, _, skipped, err := Latest(dir); {
	case len(skipped) > 0:
		fail(fmt.Errorf("skipped %v", skipped))
	case err == nil:
		step = s.Meta.Step
	case !errors.Is(err, ErrNoCheckpoint):
		fail(err)
	}
	crashPattern()
	fmt.Printf("ready %d\n", step)
	testHookRenamed = func() { fmt.Printf("renamed %d\n", step) }
	parent, start := os.Getppid(), time.Now()
	// A writer whose parent died, or that was never killed, stops itself.
	for os.Getppid() == parent && time.Since(start) < time.Minute {
		step++
		s := crashState(step)
		fmt.Printf("begin %d\n", step)
		if _, err := Save(dir, s, crashKeep); err != nil {
			fail(err)
		}
		fmt.Printf("saved %d\n", step)
	}
	os.Exit(3)
}

// checkCrashState checks that s is exactly crashState(step).
func checkCrashState(t *testing.T, s *State, step int64) {
	t.Helper()
	want := crashState(step)
	if s.Meta.Step != step || s.Meta.EpochConsumed != want.Meta.EpochConsumed || s.Meta.JobID != "crash" {
		t.Errorf("step %d: meta %+v", step, s.Meta)
	}
	for _, pair := range [][2]map[string]Tensor{{s.Tensors, want.Tensors}, {s.Optim, want.Optim}, {s.Extra, want.Extra}} {
		if len(pair[0]) != len(pair[1]) {
			t.Errorf("step %d: %d tensors, want %d", step, len(pair[0]), len(pair[1]))
		}
		for name, w := range pair[1] {
			if !bytes.Equal(pair[0][name].Data, w.Data) {
				t.Errorf("step %d: tensor %s differs from what was saved", step, name)
			}
		}
	}
}

// TestCrashSafety kills a process writing checkpoints (SIGKILL) at 20
// random moments and checks that after each kill Latest returns, fully
// verified, either the checkpoint that was newest before that writer
// started or one the writer began; never a torn one, never nothing once a
// Save has returned, never an older one than a returned Save's.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 20 s")
	}
	const rounds = 20
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(2025, 7))
	prev := int64(-1) // the newest checkpoint before this round; -1: none
	var midSave, renamed, saves int
	start := time.Now()
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$")
		cmd.Env = append(os.Environ(), helperEnv+"="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		type progress struct{ begun, saved int64 }
		done := make(chan progress, 1)
		ready := make(chan struct{})
		begins := make(chan struct{}, 1)
		renames := make(chan struct{}, 1)
		go func() {
			p := progress{-1, -1}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				verb, n, _ := strings.Cut(sc.Text(), " ")
				step, err := strconv.ParseInt(n, 10, 64)
				switch {
				case err != nil:
				case verb == "ready":
					close(ready)
				case verb == "begin":
					p.begun = step
					select {
					case begins <- struct{}{}:
					default:
					}
				case verb == "renamed":
					select {
					case renames <- struct{}{}:
					default:
					}
				case verb == "saved":
					p.saved = step
				}
			}
			done <- p
		}()
		// Rounds kill the writer, in turn:
		//   - 0 to 800 ms after it has read the latest checkpoint: before
		//     its first Save or a few Saves in;
		//   - 0 to 60 ms after it begins a Save (which takes some 50 ms):
		//     while writing, fsyncing, renaming or pruning;
		//   - 0 to 5 ms after a Save's rename: while pruning.
		// The delays are drawn whatever happens, so the schedule does not
		// depend on how fast the writer is.
		wait := []chan struct{}{ready}
		var delay time.Duration
		switch round % 3 {
		case 0:
			delay = time.Duration(rng.IntN(800)) * time.Millisecond
		case 1:
			wait = append(wait, begins)
			delay = time.Duration(rng.IntN(60_000)) * time.Microsecond
		case 2:
			wait = append(wait, renames)
			delay = time.Duration(rng.IntN(5_000)) * time.Microsecond
		}
		for _, c := range wait {
			select {
			case <-c:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: the writer did not get going; stderr:\n%s", round, stderr.Bytes())
			}
		}
		time.Sleep(delay)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p := <-done
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: writer ended with %v before it was killed; stderr:\n%s", round, err, stderr.Bytes())
		}
		if p.begun > p.saved {
			midSave++
		}
		if p.saved >= 0 {
			saves += int(p.saved - max(prev, 0))
		}

		// The newest checkpoint that must survive: the last whose Save
		// returned, else the one from before this writer (-1: none).
		last := prev
		if p.saved >= 0 {
			last = p.saved
		}
		s, path, skipped, err := Latest(dir)
		if len(skipped) > 0 {
			t.Fatalf("round %d: Latest skipped %v", round, skipped)
		}
		if err != nil {
			if errors.Is(err, ErrNoCheckpoint) && last < 0 {
				continue // killed before its first rename
			}
			t.Fatalf("round %d: Latest: %v (before: step %d; writer began %d, saved %d)", round, err, prev, p.begun, p.saved)
		}
		// Either that one, or the one in flight if the kill came after
		// its rename.
		got := s.Meta.Step
		if got > last {
			renamed++
		}
		if got != last && got != p.begun {
			t.Fatalf("round %d: Latest is step %d; before: %d; writer began %d, saved %d", round, got, prev, p.begun, p.saved)
		}
		if filepath.Base(path) != "ckpt-"+strconv.FormatInt(got, 10) {
			t.Errorf("round %d: path %s for step %d", round, path, got)
		}
		checkCrashState(t, s, got)
		entries, err := list(dir)
		if err != nil {
			t.Fatal(err)
		}
		// keep, plus the new one before the old are pruned.
		if len(entries) > crashKeep+1 {
			t.Errorf("round %d: %d checkpoints with keep %d", round, len(entries), crashKeep)
		}
		prev = got
	}
	t.Logf("%d kills (%d during a Save, %d of them after its rename) in %v; %d saves; latest step %d",
		rounds, midSave, renamed, time.Since(start).Round(time.Millisecond), saves, prev)
	if prev < 3 {
		t.Fatalf("only %d checkpoints written: the writer is too slow for the kill schedule", prev)
	}
	if midSave < rounds/4 {
		t.Errorf("only %d of %d kills landed during a Save", midSave, rounds)
	}

	// Damage the newest checkpoint on purpose: Latest must skip it, say
	// why, and fall back to the one before.
	newest := filepath.Join(dir, "ckpt-"+strconv.FormatInt(prev, 10))
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		reason string
	}{
		{"flip a byte", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0x80
			return os.WriteFile(p, b, 0o644)
		}, "sha256"},
		{"truncate", func(p string) error { return os.Truncate(p, 1<<20) }, "1048576 bytes"},
	} {
		orig, err := os.ReadFile(filepath.Join(newest, ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.damage(filepath.Join(newest, ModelFile)); err != nil {
			t.Fatal(err)
		}
		s, _, skipped, err := Latest(dir)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(skipped) != 1 || skipped[0].Path != newest || !errors.Is(skipped[0].Err, ErrCorrupt) || !strings.Contains(skipped[0].Err.Error(), tc.reason) {
			t.Errorf("%s: skipped %v, want %s (%s)", tc.name, skipped, newest, tc.reason)
		}
		if s.Meta.Step >= prev {
			t.Errorf("%s: Latest returned step %d", tc.name, s.Meta.Step)
		}
		checkCrashState(t, s, s.Meta.Step)
		os.WriteFile(filepath.Join(newest, ModelFile), orig, 0o644)
	}

	// The next Save removes what killed writers left behind.
	if _, err := Save(dir, small(prev+1), crashKeep); err != nil {
		t.Fatal(err)
	}
	for _, n := range names(t, dir) {
		if !strings.HasPrefix(n, Prefix) {
			t.Errorf("%s left in the checkpoint dir", n)
		}
	}
}
