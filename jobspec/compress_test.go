package jobspec

import (
	"strings"
	"testing"

	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestCompressionScheme: the spec's conventions become the Go configs'
// literal values (start_iter 0 is 10 for PowerSGD and 0 for the others, a
// negative start_iter is step 0, error_feedback and warm_start false turn
// them off, the seed goes to the seeded schemes); bad knobs are errors.
func TestCompressionScheme(t *testing.T) {
	tr, f := true, false
	good := []struct {
		spec *pb.CompressionSpec
		want compress.Scheme
	}{
		{nil, compress.Scheme{Type: "none"}},
		{&pb.CompressionSpec{}, compress.Scheme{Type: "none"}},
		{&pb.CompressionSpec{Type: "none"}, compress.Scheme{Type: "none"}},
		{&pb.CompressionSpec{Type: "powersgd"}, compress.Scheme{Type: "powersgd",
			PowerSGD: compress.PowerSGDConfig{StartIter: compress.DefaultStartIter, Seed: 9}}},
		{&pb.CompressionSpec{Type: "powersgd", Rank: 4, StartIter: -1, ErrorFeedback: &f, WarmStart: &f, MinCompressionRate: 1},
			compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{Rank: 4, StartIter: 0, MinCompressionRate: 1,
				NoErrorFeedback: true, NoWarmStart: true, Seed: 9}}},
		{&pb.CompressionSpec{Type: "powersgd", StartIter: 3, ErrorFeedback: &tr, WarmStart: &tr},
			compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{StartIter: 3, Seed: 9}}},
		{&pb.CompressionSpec{Type: "topk", Ratio: 0.1, ErrorFeedback: &f, StartIter: 2},
			compress.Scheme{Type: "topk", TopK: compress.TopKConfig{Ratio: 0.1, StartIter: 2, NoErrorFeedback: true}}},
		{&pb.CompressionSpec{Type: "int8", StartIter: -5}, compress.Scheme{Type: "int8", Int8: compress.Int8Config{Seed: 9}}},
		{&pb.CompressionSpec{Type: "fp16"}, compress.Scheme{Type: "fp16"}},
		{&pb.CompressionSpec{Type: "bf16", StartIter: 5}, compress.Scheme{Type: "bf16", Cast: compress.CastConfig{StartIter: 5}}},
	}
	for _, c := range good {
		got, err := CompressionScheme(c.spec, 9)
		if err != nil {
			t.Errorf("%v: %v", c.spec, err)
			continue
		}
		if got != c.want {
			t.Errorf("%v: %+v, want %+v", c.spec, got, c.want)
		}
	}
	bad := []struct {
		spec *pb.CompressionSpec
		msg  string
	}{
		{&pb.CompressionSpec{Type: "zip"}, `compress: unknown compression type "zip"; allowed: none, powersgd, topk, int8, fp16, bf16`},
		{&pb.CompressionSpec{Rank: 2}, `compress: rank does not apply to compression type "none"`},
		{&pb.CompressionSpec{Type: "none", StartIter: 1, Ratio: 0.5}, `compress: start_iter, ratio does not apply to compression type "none"`},
		{&pb.CompressionSpec{Type: "powersgd", Rank: -1}, "compress: powersgd rank -1 out of range; allowed 1..64 (0: default 2)"},
		{&pb.CompressionSpec{Type: "powersgd", Rank: 65}, "compress: powersgd rank 65 out of range"},
		{&pb.CompressionSpec{Type: "powersgd", Ratio: 0.1}, `compress: ratio does not apply to compression type "powersgd"`},
		{&pb.CompressionSpec{Type: "powersgd", MinCompressionRate: -1}, "compress: min_compression_rate -1 must be >= 0"},
		{&pb.CompressionSpec{Type: "topk", Ratio: 1.5}, "compress: topk ratio 1.5 out of range; allowed (0, 1] (0: default 0.01)"},
		{&pb.CompressionSpec{Type: "topk", Ratio: -0.5}, "compress: topk ratio -0.5 out of range"},
		{&pb.CompressionSpec{Type: "topk", Rank: 1}, `compress: rank does not apply to compression type "topk"`},
		{&pb.CompressionSpec{Type: "int8", ErrorFeedback: &tr}, `compress: error_feedback does not apply to compression type "int8"`},
		{&pb.CompressionSpec{Type: "fp16", WarmStart: &tr}, `compress: warm_start does not apply to compression type "fp16"`},
	}
	for _, c := range bad {
		if _, err := CompressionScheme(c.spec, 9); err == nil || !strings.HasPrefix(err.Error(), c.msg) {
			t.Errorf("%v: error %v, want %q", c.spec, err, c.msg)
		}
	}
}
