package worker

import (
	"strings"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
)

// TestRingAlgorithm: training runs the ring whatever is asked, and the
// reason names where the request came from (the override wins).
func TestRingAlgorithm(t *testing.T) {
	for _, c := range []struct{ spec, override, why string }{
		{"", "", "auto"},
		{"auto", "", "auto"},
		{"ring", "", "collective.algorithm asks for the ring"},
		{"ring", "tree", "GRADSYNC_ALGO asks for tree, which needs peer-to-peer links"},
		{"", "halving_doubling", "GRADSYNC_ALGO asks for halving_doubling"},
		{"", "nccl", "GRADSYNC_ALGO: unknown all-reduce algorithm"},
	} {
		a, why := ringAlgorithm(c.spec, c.override)
		if a != aggregator.AlgoRing || !strings.Contains(why, c.why) {
			t.Errorf("spec %q, override %q: %v, %q; want ring, saying %q", c.spec, c.override, a, why, c.why)
		}
	}
}
