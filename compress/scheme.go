package compress

import (
	"fmt"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
)

// Scheme is a compression type with its configuration, as New and the
// parameter-server halves take it. Only the configuration of Type is read;
// each carries its own start step. The Go configs keep their literal
// meaning (zero values take the defaults, StartIter is literal): the job
// spec's conventions (start_iter 0 meaning 10 for PowerSGD, a negative
// start_iter meaning step 0, knobs checked against the type) are applied
// by jobspec.CompressionScheme, which maps a job's CompressionSpec to a
// Scheme.
type Scheme struct {
	// Type is one of none, powersgd, topk, int8, fp16, bf16; "" means none.
	Type     string
	PowerSGD PowerSGDConfig // powersgd
	TopK     TopKConfig     // topk
	Int8     Int8Config     // int8
	Cast     CastConfig     // fp16, bf16 (the format is the type)
}

// resolve returns sc with its type named ("" becomes none), or an error
// for an unknown type.
func (sc Scheme) resolve() (Scheme, error) {
	switch sc.Type {
	case "":
		sc.Type = "none"
	case "none", "powersgd", "topk", "int8", "fp16", "bf16":
	default:
		return Scheme{}, fmt.Errorf("compress: unknown compression type %q; allowed: none, powersgd, topk, int8, fp16, bf16", sc.Type)
	}
	return sc, nil
}

// start returns the first compressed step of a resolved scheme.
func (sc Scheme) start() int64 {
	switch sc.Type {
	case "powersgd":
		return sc.PowerSGD.StartIter
	case "topk":
		return sc.TopK.StartIter
	case "int8":
		return sc.Int8.StartIter
	case "fp16", "bf16":
		return sc.Cast.StartIter
	}
	return 0
}

// format returns the Format of a cast scheme.
func (sc Scheme) format() Format {
	if sc.Type == "bf16" {
		return BF16
	}
	return FP16
}

// New builds the Reducer sc names; type "" or "none" gives the plain
// all-reduce. Every returned Reducer also implements Stateful.
func New(sc Scheme, ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int) (Reducer, error) {
	if _, err := checkSegments(segs); err != nil {
		return nil, err
	}
	sc, err := sc.resolve()
	if err != nil {
		return nil, err
	}
	switch sc.Type {
	case "powersgd":
		return NewPowerSGD(ring, opts, segs, bucketCapBytes, sc.PowerSGD)
	case "topk":
		return NewTopK(ring, opts, segs, bucketCapBytes, sc.TopK)
	case "int8":
		return NewInt8(ring, opts, segs, bucketCapBytes, sc.Int8)
	case "fp16", "bf16":
		return NewCast(ring, opts, segs, bucketCapBytes, sc.format(), sc.Cast)
	}
	return NewPlain(ring, opts, segs, bucketCapBytes), nil
}
