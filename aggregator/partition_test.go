package aggregator

import (
	"math/rand/v2"
	"testing"
)

// checkPartition checks the properties Partition promises for (n, k).
func checkPartition(t *testing.T, n, k int) {
	t.Helper()
	rs := Partition(n, k)
	if len(rs) != k {
		t.Fatalf("Partition(%d, %d): %d ranges", n, k, len(rs))
	}
	seen := make([]int, n)
	lo, minLen, maxLen := 0, n+1, -1
	for i, r := range rs {
		if r.Lo != lo || r.Hi < r.Lo {
			t.Fatalf("Partition(%d, %d): range %d is %v; want it to start at %d and not be reversed", n, k, i, r, lo)
		}
		for j := r.Lo; j < r.Hi; j++ {
			seen[j]++
		}
		lo = r.Hi
		minLen, maxLen = min(minLen, r.Len()), max(maxLen, r.Len())
		if i > 0 && r.Len() > rs[i-1].Len() {
			t.Fatalf("Partition(%d, %d): range %d (%d elements) is longer than range %d (%d)", n, k, i, r.Len(), i-1, rs[i-1].Len())
		}
	}
	if lo != n {
		t.Fatalf("Partition(%d, %d): ranges end at %d", n, k, lo)
	}
	for j, c := range seen {
		if c != 1 {
			t.Fatalf("Partition(%d, %d): index %d covered %d times", n, k, j, c)
		}
	}
	if maxLen-minLen > 1 {
		t.Fatalf("Partition(%d, %d): sizes %d..%d differ by more than 1", n, k, minLen, maxLen)
	}
}

// TestPartitionProperties: every index is covered exactly once, by
// contiguous ranges in order whose sizes differ by at most one element
// (longer ones first) — exhaustively for small vectors, then at random.
func TestPartitionProperties(t *testing.T) {
	for n := 0; n <= 40; n++ {
		for k := 1; k <= 12; k++ {
			checkPartition(t, n, k)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		checkPartition(t, rng.IntN(300_000), 1+rng.IntN(64))
	}
	// The model sizes the shards are used with (logreg, mlp).
	checkPartition(t, 7850, 2)
	checkPartition(t, 7850, 3)
	checkPartition(t, 109386, 3)
}

func TestPartitionKnown(t *testing.T) {
	got := Partition(10, 3)
	want := []Range{{0, 4}, {4, 7}, {7, 10}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Partition(10, 3) = %v, want %v", got, want)
		}
	}
	if rs := Partition(2, 4); rs[2].Len() != 0 || rs[3].Len() != 0 || rs[1] != (Range{1, 2}) {
		t.Fatalf("Partition(2, 4) = %v: want two ranges of one element, then two empty ones", rs)
	}
}

func TestPartitionPanics(t *testing.T) {
	for _, c := range [][2]int{{-1, 1}, {5, 0}, {5, -2}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Partition(%d, %d) did not panic", c[0], c[1])
				}
			}()
			Partition(c[0], c[1])
		}()
	}
}
