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
	sc, err := parseScheme(spec, seed)
	if err != nil {
		return nil, err
	}
	switch sc.typ {
	case "powersgd":
		return NewPowerSGD(ring, opts, segs, bucketCapBytes, sc.psgd)
	case "topk":
		return NewTopK(ring, opts, segs, bucketCapBytes, sc.topk)
	case "int8":
		return NewInt8(ring, opts, segs, bucketCapBytes, sc.int8)
	case "fp16", "bf16":
		return NewCast(ring, opts, segs, bucketCapBytes, sc.cast, CastConfig{StartIter: sc.start})
	}
	return NewPlain(ring, opts, segs, bucketCapBytes), nil
}

// scheme is a validated CompressionSpec as the configuration of its
// type (defaults not yet resolved: the constructors do that).
type scheme struct {
	typ   string // none, powersgd, topk, int8, fp16, bf16
	start int64  // the first compressed step
	psgd  PowerSGDConfig
	topk  TopKConfig
	int8  Int8Config
	cast  Format
}

// parseScheme maps a CompressionSpec to its type's configuration, with
// the spec's conventions (see New).
func parseScheme(spec *pb.CompressionSpec, seed int64) (scheme, error) {
	typ := spec.GetType()
	if typ == "" {
		typ = "none"
	}
	start := spec.GetStartIter()
	if start < 0 {
		start = 0
	}
	if err := Validate(spec); err != nil {
		return scheme{}, err
	}
	sc := scheme{typ: typ, start: start}
	noEF := spec != nil && spec.ErrorFeedback != nil && !*spec.ErrorFeedback
	switch typ {
	case "powersgd":
		if spec.GetStartIter() == 0 {
			sc.start = DefaultStartIter
		}
		sc.psgd = PowerSGDConfig{
			Rank:               int(spec.GetRank()),
			StartIter:          sc.start,
			MinCompressionRate: spec.GetMinCompressionRate(),
			NoErrorFeedback:    noEF,
			NoWarmStart:        spec.WarmStart != nil && !*spec.WarmStart,
			Seed:               seed,
		}
	case "topk":
		sc.topk = TopKConfig{Ratio: spec.GetRatio(), StartIter: start, NoErrorFeedback: noEF}
	case "int8":
		sc.int8 = Int8Config{StartIter: start, Seed: seed}
	case "fp16":
		sc.cast = FP16
	case "bf16":
		sc.cast = BF16
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
