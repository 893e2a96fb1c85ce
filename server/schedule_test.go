package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSchedule(t *testing.T) {
	cases := []struct {
		name  string
		queue []pendingJob
		idle  []string
		want  []placement
	}{
		{"empty", nil, []string{"a"}, nil},
		{"no workers", []pendingJob{{"j1", 1}}, nil, nil},
		{"fits", []pendingJob{{"j1", 2}}, []string{"a", "b", "c"}, []placement{{"j1", []string{"a", "b"}}}},
		{"two fit", []pendingJob{{"j1", 1}, {"j2", 2}}, []string{"a", "b", "c"}, []placement{{"j1", []string{"a"}}, {"j2", []string{"b", "c"}}}},
		{"head blocks", []pendingJob{{"j1", 3}, {"j2", 1}}, []string{"a", "b"}, nil},
		{"second blocks third", []pendingJob{{"j1", 1}, {"j2", 5}, {"j3", 1}}, []string{"a", "b"}, []placement{{"j1", []string{"a"}}}},
	}
	for _, c := range cases {
		got := schedule(c.queue, c.idle)
		if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(placement{})); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", c.name, diff)
		}
	}
}
