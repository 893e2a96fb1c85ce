package rpc

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestStreamTags(t *testing.T) {
	job, gen, idx, err := StreamTags(metadata.Pairs(MDJob, "j", MDGeneration, "7", "gradsync-rank", "3"), "test", "gradsync-rank", "rank", 10)
	if err != nil || job != "j" || gen != 7 || idx != 3 {
		t.Fatalf("got %q %d %d %v", job, gen, idx, err)
	}
	for _, tc := range []struct {
		name string
		md   metadata.MD
		msg  string
	}{
		{"none", metadata.MD{}, `exactly one "gradsync-job"`},
		{"two jobs", metadata.Pairs(MDJob, "a", MDJob, "b"), `exactly one "gradsync-job" metadata value (got 2)`},
		{"no generation", metadata.Pairs(MDJob, "a"), `exactly one "gradsync-generation"`},
		{"bad generation", metadata.Pairs(MDJob, "a", MDGeneration, "-1", "gradsync-rank", "0"), "not an unsigned integer"},
		{"no index", metadata.Pairs(MDJob, "a", MDGeneration, "1"), `exactly one "gradsync-rank"`},
		{"negative index", metadata.Pairs(MDJob, "a", MDGeneration, "1", "gradsync-rank", "-1"), "is not a rank"},
		{"index too large", metadata.Pairs(MDJob, "a", MDGeneration, "1", "gradsync-rank", "11"), "is not a rank (an integer in [0, 10])"},
		{"not a number", metadata.Pairs(MDJob, "a", MDGeneration, "1", "gradsync-rank", "x"), "is not a rank"},
	} {
		_, _, _, err := StreamTags(tc.md, "test", "gradsync-rank", "rank", 10)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v; want InvalidArgument saying %q", tc.name, err, tc.msg)
		}
	}
}
