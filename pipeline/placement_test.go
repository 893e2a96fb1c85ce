package pipeline

import (
	"slices"
	"testing"
)

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		rank, world, stages int
		replica, stage      int
		prev, next          int
		group               []int
	}{
		{0, 1, 1, 0, 0, -1, -1, []int{0}},
		{0, 2, 2, 0, 0, -1, 1, []int{0}},
		{1, 2, 2, 0, 1, 0, -1, []int{1}},
		{0, 2, 1, 0, 0, -1, -1, []int{0, 1}},
		{1, 2, 1, 1, 0, -1, -1, []int{0, 1}},
		{0, 4, 2, 0, 0, -1, 1, []int{0, 2}},
		{1, 4, 2, 0, 1, 0, -1, []int{1, 3}},
		{2, 4, 2, 1, 0, -1, 3, []int{0, 2}},
		{3, 4, 2, 1, 1, 2, -1, []int{1, 3}},
		{4, 6, 3, 1, 1, 3, 5, []int{1, 4}},
		{5, 8, 4, 1, 1, 4, 6, []int{1, 5}},
	} {
		c, err := Place(tc.rank, tc.world, tc.stages)
		if err != nil {
			t.Fatalf("Place(%d, %d, %d): %v", tc.rank, tc.world, tc.stages, err)
		}
		if c.Replica != tc.replica || c.Stage != tc.stage || c.Prev() != tc.prev || c.Next() != tc.next ||
			!slices.Equal(c.StageGroup(), tc.group) || c.Replicas*c.Stages != tc.world {
			t.Errorf("Place(%d, %d, %d) = %+v prev %d next %d group %v; want replica %d stage %d prev %d next %d group %v",
				tc.rank, tc.world, tc.stages, c, c.Prev(), c.Next(), c.StageGroup(), tc.replica, tc.stage, tc.prev, tc.next, tc.group)
		}
		if c.StageGroup()[c.Replica] != tc.rank || c.RankOf(c.Replica, c.Stage) != tc.rank {
			t.Errorf("Place(%d, %d, %d): rank not at its own coordinates", tc.rank, tc.world, tc.stages)
		}
	}
	for _, bad := range [][3]int{{0, 3, 2}, {0, 2, 0}, {2, 2, 1}, {-1, 2, 1}, {0, 0, 1}} {
		if _, err := Place(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("Place(%v) accepted", bad)
		}
	}
}
