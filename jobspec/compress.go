package jobspec

import (
	"fmt"
	"strings"

	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// CompressionScheme maps a job's CompressionSpec to the compress.Scheme
// that New and the parameter-server halves take. A nil spec or type "" or
// "none" is the plain all-reduce. The spec's zero values take the defaults
// of the compress package documentation (powersgd: rank 2, start_iter 10,
// min_compression_rate 2, error feedback and warm start on; topk: ratio
// 0.01, error feedback on); a negative start_iter means "compress from
// step 0". A knob that does not apply to the type is an error, as is an
// out-of-range value (checkCompression). seed must be the same on every
// rank (the job's seed).
func CompressionScheme(spec *pb.CompressionSpec, seed int64) (compress.Scheme, error) {
	if err := checkCompression(spec); err != nil {
		return compress.Scheme{}, err
	}
	typ := spec.GetType()
	if typ == "" {
		typ = "none"
	}
	start := max(spec.GetStartIter(), 0)
	sc := compress.Scheme{Type: typ}
	noEF := spec != nil && spec.ErrorFeedback != nil && !*spec.ErrorFeedback
	switch typ {
	case "powersgd":
		if spec.GetStartIter() == 0 {
			start = compress.DefaultStartIter
		}
		sc.PowerSGD = compress.PowerSGDConfig{
			Rank:               int(spec.GetRank()),
			StartIter:          start,
			MinCompressionRate: spec.GetMinCompressionRate(),
			NoErrorFeedback:    noEF,
			NoWarmStart:        spec.WarmStart != nil && !*spec.WarmStart,
			Seed:               seed,
		}
	case "topk":
		sc.TopK = compress.TopKConfig{Ratio: spec.GetRatio(), StartIter: start, NoErrorFeedback: noEF}
	case "int8":
		sc.Int8 = compress.Int8Config{StartIter: start, Seed: seed}
	case "fp16", "bf16":
		sc.Cast = compress.CastConfig{StartIter: start}
	}
	return sc, nil
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

// checkCompression checks a compression spec without building a reducer:
// a known type, and only the knobs that apply to it (a knob set for
// another type is an error, never ignored). An empty type means "none".
// Its messages keep the "compress: " prefix of the package whose knobs
// they are; Normalize strips it under the field name.
func checkCompression(spec *pb.CompressionSpec) error {
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
		return fmt.Errorf("compress: powersgd rank %d out of range; allowed 1..64 (0: default %d)", spec.GetRank(), compress.DefaultPowerSGDRank)
	case spec.GetMinCompressionRate() < 0:
		return fmt.Errorf("compress: min_compression_rate %v must be >= 0", spec.GetMinCompressionRate())
	case spec.GetRatio() < 0 || spec.GetRatio() > 1:
		return fmt.Errorf("compress: topk ratio %v out of range; allowed (0, 1] (0: default 0.01)", spec.GetRatio())
	}
	return nil
}
