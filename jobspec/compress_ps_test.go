package jobspec

import (
	"testing"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Every compression type is accepted in ps mode (compressed pushes) as in
// ring mode, with its knobs.
func TestCompressionInPSMode(t *testing.T) {
	for _, c := range []*pb.CompressionSpec{
		{Type: "powersgd", Rank: 2, StartIter: 5},
		{Type: "topk", Ratio: 0.01},
		{Type: "int8"},
		{Type: "fp16"},
		{Type: "bf16"},
	} {
		for _, mode := range []string{"ps", "ring"} {
			s, err := Normalize(&pb.JobSpec{Mode: mode, Compression: c}, Architectures)
			if err != nil {
				t.Errorf("%s in mode %s: %v", c.Type, mode, err)
				continue
			}
			if s.GetCompression().GetType() != c.Type {
				t.Errorf("%s in mode %s: normalised to %q", c.Type, mode, s.GetCompression().GetType())
			}
		}
	}
}
