package compress

import (
	"testing"

	"github.com/gradsync/gradsync/models"
)

// TestBucketizeFirstBucket: with the default cap the first bucket (the
// last layers) stays under 1 MiB unless one tensor alone is larger, the
// others under 25 MiB, and together they tile the buffer from the top.
func TestBucketizeFirstBucket(t *testing.T) {
	net, err := models.New("cnn", models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := bucketize(net.Segments(), DefaultBucketCapBytes)
	// cnn, last first: 10.bias, 10.weight, 7.bias (1,418 values) — 7.weight
	// (1,179,648 values, 4.5 MiB) would not fit in 1 MiB — | 7.weight and
	// the convolutions (4.6 MiB < 25 MiB), as DDP buckets it.
	want := []span{{1198464, 1199882}, {0, 1198464}}
	if b1 := bucketize(net.Segments(), 1<<20); len(b1) != 3 || b1[1] != (span{18816, 1198464}) {
		t.Errorf("1 MiB cap: buckets %v, want 7.weight alone in the second", b1)
	}
	if len(b) != len(want) {
		t.Fatalf("buckets %v, want %v", b, want)
	}
	for i := range want {
		if b[i] != want[i] {
			t.Fatalf("buckets %v, want %v", b, want)
		}
	}
}
