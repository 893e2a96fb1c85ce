package worker

import (
	"slices"
	"testing"
)

// TestChoosePipeMemory: the newest step some rank of every stage holds,
// from the newest earlier generation, sent by the lowest rank holding it.
func TestChoosePipeMemory(t *testing.T) {
	info := func(gen uint64, stage, newest, older int64) pipeSnapInfo {
		return pipeSnapInfo{snapInfo: snapInfo{gen: gen, newest: newest, older: older}, stage: stage}
	}
	none := pipeSnapInfo{snapInfo: snapInfo{newest: -1, older: -1}, stage: -1}
	for _, tc := range []struct {
		name  string
		infos []pipeSnapInfo
		step  int64
		src   []int
	}{
		{"fresh job", []pipeSnapInfo{none, none}, -1, nil},
		{"survivors of both stages at one step", []pipeSnapInfo{info(1, 0, 7, 6), info(1, 1, 7, 6)}, 7, []int{0, 1}},
		{"stage 1 one step ahead (it finished step 8)", []pipeSnapInfo{info(1, 0, 7, 6), info(1, 1, 8, 7)}, 7, []int{0, 1}},
		{"survivor changed stage: rank 0 holds stage 1", []pipeSnapInfo{info(1, 1, 7, 6), info(1, 0, 7, 6)}, 7, []int{1, 0}},
		{"a replacement holds nothing", []pipeSnapInfo{info(1, 0, 7, 6), info(1, 1, 7, 6), info(1, 0, 7, 6), none}, 7, []int{0, 1}},
		{"no rank holds stage 1", []pipeSnapInfo{info(1, 0, 7, 6), none}, -1, nil},
		{"stages without a common step", []pipeSnapInfo{info(1, 0, 9, 8), info(1, 1, 7, 6)}, -1, nil},
		{"older generations do not count", []pipeSnapInfo{info(1, 0, 3, 2), info(2, 0, 7, 6), info(2, 1, 7, 6)}, 7, []int{1, 2}},
		{"the new generation's own snapshots do not count", []pipeSnapInfo{info(3, 0, 9, 8), info(3, 1, 9, 8)}, -1, nil},
		{"first step: the older snapshot is none", []pipeSnapInfo{info(1, 0, 1, 0), info(1, 1, 0, -1)}, 0, []int{0, 1}},
	} {
		c := choosePipeMemory(tc.infos, 3, 2)
		if c.step != tc.step || !slices.Equal(c.src, tc.src) {
			t.Errorf("%s: step %d from %v; want %d from %v", tc.name, c.step, c.src, tc.step, tc.src)
		}
	}
}

// TestPipeSnapInfoEncoding: the info survives its float32 encoding.
func TestPipeSnapInfoEncoding(t *testing.T) {
	in := pipeSnapInfo{snapInfo: snapInfo{gen: 1 << 40, newest: 123456789, older: -1}, stage: 3}
	var b [pipeInfoLen]float32
	in.encode(b[:])
	if got := decodePipeInfo(b[:]); got != in {
		t.Errorf("decoded %+v, want %+v", got, in)
	}
}
