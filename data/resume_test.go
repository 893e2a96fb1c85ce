package data

import (
	"fmt"
	"slices"
	"testing"
)

// consumedBy returns the indices a job of world ranks has trained on in
// the epoch once the first consumed positions of its global order are
// done, as the current Sampler hands them out: rank r's first
// ceil((consumed−r)/world) indices.
func consumedBy(t *testing.T, n int, seed int64, epoch, consumed, world int) []int {
	t.Helper()
	var out []int
	for r := range world {
		s, err := NewSampler(n, r, world, seed, true, false)
		if err != nil {
			t.Fatal(err)
		}
		idx := s.Epoch(epoch)
		k := 0
		if consumed > r {
			k = min((consumed-r+world-1)/world, len(idx))
		}
		out = append(out, idx[:k]...)
	}
	return out
}

// resumed returns every new rank's ResumeSampler indices, checking their
// lengths against ResumeLen and each other.
func resumed(t *testing.T, n int, seed int64, epoch, consumed, world int) [][]int {
	t.Helper()
	out := make([][]int, world)
	total := 0
	for r := range world {
		out[r] = ResumeSampler(n, seed, epoch, consumed, r, world)
		if got, want := len(out[r]), ResumeLen(n, consumed, r, world); got != want {
			t.Errorf("rank %d: %d indices, ResumeLen says %d", r, got, want)
		}
		if d := len(out[0]) - len(out[r]); d < 0 || d > 1 {
			t.Errorf("rank %d has %d indices, rank 0 %d: want rank 0's or one fewer", r, len(out[r]), len(out[0]))
		}
		total += len(out[r])
	}
	if want := n - min(consumed, n); total != want {
		t.Errorf("%d indices resumed, want %d", total, want)
	}
	return out
}

// exactlyOnce reports the first index of 0..n-1 that parts do not hold
// exactly once between them.
func exactlyOnce(n int, parts ...[]int) error {
	count := make([]int, n)
	for _, p := range parts {
		for _, i := range p {
			if i < 0 || i >= n {
				return fmt.Errorf("index %d out of range", i)
			}
			count[i]++
		}
	}
	for i, c := range count {
		if c != 1 {
			return fmt.Errorf("index %d visited %d times", i, c)
		}
	}
	return nil
}

func TestResumeWorldChange(t *testing.T) {
	const seed, epoch, batch = 11, 3, 4
	for _, ws := range [][2]int{{2, 3}, {3, 2}, {1, 4}, {4, 1}, {3, 3}, {4, 3}} {
		for _, n := range []int{0, 1, 5, 12, 13, 97, 100} {
			old, neu := ws[0], ws[1]
			steps := (n + old - 1) / old / batch // full steps the old job takes
			for _, c := range []int{0, 1, 7, steps / 2 * batch * old, steps * batch * old, n} {
				name := fmt.Sprintf("%d→%d/n=%d/consumed=%d", old, neu, n, c)
				t.Run(name, func(t *testing.T) {
					done := consumedBy(t, n, seed, epoch, c, old)
					rest := resumed(t, n, seed, epoch, c, neu)
					if c > n {
						// The old job has run into Sampler's padding,
						// which repeats indices: all are done.
						slices.Sort(done)
						if done = slices.Compact(done); len(done) != n {
							t.Errorf("%d distinct indices consumed, want %d", len(done), n)
						}
						return
					}
					if err := exactlyOnce(n, append(rest, done)...); err != nil {
						t.Error(err)
					}
				})
			}
		}
	}
}

// TestResumeAfterFullEpoch: a checkpoint at the last step of an epoch
// may count Sampler's padding (consumed > n); nothing is left.
func TestResumeAfterFullEpoch(t *testing.T) {
	for _, world := range []int{1, 2, 3} {
		if got := ResumeSampler(13, 1, 0, 15, world-1, world); len(got) != 0 {
			t.Errorf("world %d: %v after the whole epoch", world, got)
		}
	}
}

// TestResumeMatchesSampler: before any resume (consumed 0), and resuming
// with the same world size at a step boundary, ResumeSampler continues
// exactly what Sampler hands out, less its padding.
func TestResumeMatchesSampler(t *testing.T) {
	const seed, batch = 5, 3
	for _, n := range []int{1, 10, 11, 64} {
		for _, world := range []int{1, 2, 3, 4} {
			for r := range world {
				s, err := NewSampler(n, r, world, seed, true, false)
				if err != nil {
					t.Fatal(err)
				}
				for epoch := range 2 {
					full := s.Epoch(epoch)
					for step := 0; step*batch < len(full); step++ {
						got := ResumeSampler(n, seed, epoch, step*batch*world, r, world)
						want := full[step*batch:]
						// Sampler pads by at most one index per rank.
						if pad := len(want) - len(got); pad < 0 || pad > 1 || !slices.Equal(got, want[:len(got)]) {
							t.Fatalf("n=%d world=%d rank=%d epoch=%d step=%d: %v, Sampler %v", n, world, r, epoch, step, got, full[step*batch:])
						}
					}
				}
			}
		}
	}
}

// TestResumeTwice resumes an epoch twice, 4→3 and then, after the three
// ranks trained some lockstep steps, 3→2: every index exactly once.
func TestResumeTwice(t *testing.T) {
	const n, seed, epoch, batch = 103, 9, 1, 5
	c1 := 2 * batch * 4
	parts := [][]int{consumedBy(t, n, seed, epoch, c1, 4)}
	mid := resumed(t, n, seed, epoch, c1, 3)
	const k = 3 // lockstep steps the 3 ranks take
	for r := range 3 {
		parts = append(parts, mid[r][:min(k*batch, len(mid[r]))])
	}
	c2 := min(c1+k*batch*3, n)
	parts = append(parts, resumed(t, n, seed, epoch, c2, 2)...)
	if err := exactlyOnce(n, parts...); err != nil {
		t.Error(err)
	}
}

// TestResumeSteps checks ResumeSteps and ResumeGlobalBatch against the
// batches ResumeSampler's indices make.
func TestResumeSteps(t *testing.T) {
	for _, tc := range []struct{ n, consumed, world, batch int }{
		{13, 0, 2, 4}, {13, 5, 3, 2}, {100, 37, 4, 8}, {7, 0, 3, 2}, {7, 7, 3, 2}, {9, 2, 1, 3}, {3, 0, 5, 1},
	} {
		parts := resumed(t, tc.n, 1, 0, tc.consumed, tc.world)
		steps := ResumeSteps(tc.n, tc.consumed, tc.world, tc.batch)
		total := 0
		for k := 0; k <= steps; k++ {
			g := 0
			for _, p := range parts {
				g += max(0, min((k+1)*tc.batch, len(p))-k*tc.batch)
			}
			if got := ResumeGlobalBatch(tc.n, tc.consumed, tc.world, tc.batch, k); got != g {
				t.Errorf("%+v step %d: ResumeGlobalBatch %d, ranks' batches hold %d", tc, k, got, g)
			}
			if k < steps && g == 0 {
				t.Errorf("%+v: step %d of %d is empty", tc, k, steps)
			}
			if k == steps && g != 0 {
				t.Errorf("%+v: %d indices left after %d steps", tc, g, steps)
			}
			total += g
		}
		if want := tc.n - tc.consumed; total != want {
			t.Errorf("%+v: %d indices in %d steps, want %d", tc, total, steps, want)
		}
	}
}

func TestResumePanics(t *testing.T) {
	for _, f := range []func(){
		func() { ResumeSampler(-1, 0, 0, 0, 0, 1) },
		func() { ResumeSampler(5, 0, 0, -1, 0, 1) },
		func() { ResumeSampler(5, 0, 0, 0, 0, 0) },
		func() { ResumeSampler(5, 0, 0, 0, 2, 2) },
		func() { ResumeSteps(5, 0, 1, 0) },
		func() { ResumeGlobalBatch(5, 0, 1, 1, -1) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Error("no panic")
				}
			}()
			f()
		}()
	}
}
