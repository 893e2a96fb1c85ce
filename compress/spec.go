package compress

import (
	"fmt"
	"strings"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// New builds the Reducer a CompressionSpec asks for; a nil spec or type
// "" or "none" gives the plain all-reduce. The spec's zero values take the
// defaults of the package documentation (powersgd: rank 2, start_iter 10,
// min_compression_rate 2, error feedback and warm start on; topk: ratio
// 0.01, error feedback on); a negative start_iter means "compress from step
// 0". A knob that does not apply to the type is an error, as is an
// out-of-range value. seed must be the same on every rank (the job's seed).
// Every returned Reducer also implements Stateful.
func New(spec *pb.CompressionSpec, ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, seed int64) (Reducer, error) {
	if _, err := checkSegments(segs); err != nil {
		return nil, err
	}
	typ := spec.GetType()
	if typ == "" {
		typ = "none"
	}
	start := spec.GetStartIter()
	if start < 0 {
		start = 0
	}
	if err := Validate(spec); err != nil {
		return nil, err
	}
	switch typ {
	case "none":
		return NewPlain(ring, opts, segs, bucketCapBytes), nil
	case "powersgd":
		if spec.GetStartIter() == 0 {
			start = DefaultStartIter
		}
		return NewPowerSGD(ring, opts, segs, bucketCapBytes, PowerSGDConfig{
			Rank:               int(spec.GetRank()),
			StartIter:          start,
			MinCompressionRate: spec.GetMinCompressionRate(),
			NoErrorFeedback:    spec.ErrorFeedback != nil && !*spec.ErrorFeedback,
			NoWarmStart:        spec.WarmStart != nil && !*spec.WarmStart,
			Seed:               seed,
		})
	case "topk":
		return NewTopK(ring, opts, segs, bucketCapBytes, TopKConfig{
			Ratio:           spec.GetRatio(),
			StartIter:       start,
			NoErrorFeedback: spec.ErrorFeedback != nil && !*spec.ErrorFeedback,
		})
	case "int8":
		return NewInt8(ring, opts, segs, bucketCapBytes, Int8Config{StartIter: start, Seed: seed})
	case "fp16", "bf16":
		f := FP16
		if typ == "bf16" {
			f = BF16
		}
		return NewCast(ring, opts, segs, bucketCapBytes, f, CastConfig{StartIter: start})
	}
	return nil, fmt.Errorf("compress: unknown compression type %q; allowed: none, powersgd, topk, int8, fp16, bf16", typ)
}

// notApplicable lists, per compression type, the knobs that do not apply
// to it.
var notApplicable = map[string][]string{
	"none":     {"rank", "start_iter", "min_compression_rate", "error_feedback", "warm_start", "ratio"},
	"powersgd": {"ratio"},
	"topk":     {"rank", "min_compression_rate", "warm_start"},
	"int8":     {"rank", "min_compression_rate", "error_feedback", "warm_start", "ratio"},
	"fp16":     {"rank", "min_compression_rate", "error_feedback", "warm_start", "ratio"},
	"bf16":     {"rank", "min_compression_rate", "error_feedback", "warm_start", "ratio"},
}

// Validate checks a compression spec without building a reducer: a known
// type, and only the knobs that apply to it (a knob set for another type
// is an error, never ignored). An empty type means "none".
func Validate(spec *pb.CompressionSpec) error {
	typ := spec.GetType()
	if typ == "" {
		typ = "none"
	}
	knobs, ok := notApplicable[typ]
	if !ok {
		return fmt.Errorf("compress: unknown compression type %q; allowed: none, powersgd, topk, int8, fp16, bf16", typ)
	}
	set := map[string]bool{
		"rank":                 spec.GetRank() != 0,
		"start_iter":           spec.GetStartIter() != 0,
		"min_compression_rate": spec.GetMinCompressionRate() != 0,
		"error_feedback":       spec != nil && spec.ErrorFeedback != nil,
		"warm_start":           spec != nil && spec.WarmStart != nil,
		"ratio":                spec.GetRatio() != 0,
	}
	var bad []string
	for _, n := range knobs {
		if set[n] {
			bad = append(bad, n)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("compress: %s does not apply to compression type %q", strings.Join(bad, ", "), typ)
	}
	switch {
	case spec.GetRank() < 0 || spec.GetRank() > 64:
		return fmt.Errorf("compress: powersgd rank %d out of range; allowed 1..64 (0: default %d)", spec.GetRank(), DefaultPowerSGDRank)
	case spec.GetMinCompressionRate() < 0:
		return fmt.Errorf("compress: min_compression_rate %v must be >= 0", spec.GetMinCompressionRate())
	case spec.GetRatio() < 0 || spec.GetRatio() > 1:
		return fmt.Errorf("compress: topk ratio %v out of range; allowed (0, 1] (0: default 0.01)", spec.GetRatio())
	}
	return nil
}
