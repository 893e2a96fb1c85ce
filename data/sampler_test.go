package data

import (
	"fmt"
	"slices"
	"testing"
)

func TestSamplerCoversAndBalances(t *testing.T) {
	for _, n := range []int{0, 1, 2, 5, 7, 12, 100, 101} {
		for _, world := range []int{1, 2, 3, 4, 8} {
			for _, shuffle := range []bool{false, true} {
				for _, dropLast := range []bool{false, true} {
					name := fmt.Sprintf("n=%d/world=%d/shuffle=%v/dropLast=%v", n, world, shuffle, dropLast)
					t.Run(name, func(t *testing.T) { checkSampler(t, n, world, shuffle, dropLast) })
				}
			}
		}
	}
}

func checkSampler(t *testing.T, n, world int, shuffle, dropLast bool) {
	wantLen := (n + world - 1) / world
	if dropLast {
		wantLen = n / world
	}
	count := make([]int, n)
	for rank := range world {
		s, err := NewSampler(n, rank, world, 11, shuffle, dropLast)
		if err != nil {
			t.Fatal(err)
		}
		got := s.Epoch(3)
		if len(got) != wantLen || s.Len() != wantLen {
			t.Fatalf("rank %d: %d indices (Len %d), want %d", rank, len(got), s.Len(), wantLen)
		}
		for _, i := range got {
			if i < 0 || i >= n {
				t.Fatalf("rank %d: index %d out of range", rank, i)
			}
			count[i]++
		}
	}
	total := 0
	for i, c := range count {
		total += c
		switch {
		case dropLast && c > 1, !dropLast && n >= world && c > 2:
			t.Fatalf("index %d seen %d times", i, c)
		case !dropLast && c == 0:
			t.Fatalf("index %d never seen", i)
		}
	}
	if total != wantLen*world {
		t.Fatalf("%d indices in all, want %d", total, wantLen*world)
	}
	if (dropLast || n%world == 0) && n >= world {
		// Exactly-once coverage of the kept prefix: no repeats at all.
		for i, c := range count {
			if c > 1 {
				t.Fatalf("index %d seen %d times", i, c)
			}
		}
		if n%world == 0 && total != n {
			t.Fatalf("covered %d of %d", total, n)
		}
	}
}

func TestSamplerTorchOrder(t *testing.T) {
	// Without shuffling the result is torch's, exactly: indices padded by
	// wrapping, then strided by rank.
	for _, tt := range []struct {
		n, rank, world int
		dropLast       bool
		want           []int
	}{
		{10, 0, 3, false, []int{0, 3, 6, 9}},
		{10, 1, 3, false, []int{1, 4, 7, 0}},
		{10, 2, 3, false, []int{2, 5, 8, 1}},
		{10, 2, 3, true, []int{2, 5, 8}},
		{2, 4, 5, false, []int{0}},
		{2, 3, 5, false, []int{1}},
		{2, 3, 5, true, []int{}},
	} {
		s, err := NewSampler(tt.n, tt.rank, tt.world, 0, false, tt.dropLast)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Epoch(0); !slices.Equal(got, tt.want) {
			t.Errorf("n=%d rank=%d world=%d dropLast=%v: %v, want %v", tt.n, tt.rank, tt.world, tt.dropLast, got, tt.want)
		}
	}
}

func TestSamplerDeterministicPerEpoch(t *testing.T) {
	a, _ := NewSampler(1000, 1, 4, 5, true, false)
	b, _ := NewSampler(1000, 1, 4, 5, true, false)
	if !slices.Equal(a.Epoch(2), b.Epoch(2)) {
		t.Fatal("same seed and epoch gave different orders")
	}
	if slices.Equal(a.Epoch(2), a.Epoch(3)) {
		t.Fatal("epochs 2 and 3 gave the same order")
	}
	c, _ := NewSampler(1000, 1, 4, 6, true, false)
	if slices.Equal(a.Epoch(2), c.Epoch(2)) {
		t.Fatal("seeds 5 and 6 gave the same order")
	}
	// torch seeds with seed+epoch: (seed 5, epoch 3) equals (seed 6, epoch 2).
	if !slices.Equal(a.Epoch(3), c.Epoch(2)) {
		t.Fatal("seed+epoch is not what seeds the permutation")
	}
	dst := make([]int, a.Len())
	if a := testing.AllocsPerRun(10, func() { a.EpochInto(dst, 1) }); a > 1 {
		t.Fatalf("EpochInto allocates %v times, want ≤ 1 (the permutation)", a)
	}
}

func TestSamplerErrors(t *testing.T) {
	for _, a := range [][3]int{{-1, 0, 1}, {5, 0, 0}, {5, 2, 2}, {5, -1, 2}} {
		if _, err := NewSampler(a[0], a[1], a[2], 0, true, false); err == nil {
			t.Errorf("NewSampler(n=%d, rank=%d, world=%d) gave no error", a[0], a[1], a[2])
		}
	}
}

func TestSamplerNumBatches(t *testing.T) {
	s, _ := NewSampler(10, 0, 3, 0, true, false) // 4 per rank
	for batch, want := range map[int]int{1: 4, 3: 2, 4: 1, 5: 1} {
		if got := s.NumBatches(batch); got != want {
			t.Errorf("NumBatches(%d) = %d, want %d", batch, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NumBatches(0) did not panic")
		}
	}()
	s.NumBatches(0)
}
