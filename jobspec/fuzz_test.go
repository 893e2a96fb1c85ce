package jobspec

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// FuzzParseNormalize: no input makes Parse or Normalize panic, and a spec
// that normalizes is a fixed point: written out and read back, it
// normalizes to itself.
func FuzzParseNormalize(f *testing.F) {
	for _, s := range []string{
		"",
		"model: mlp\nworkers: 2\nepochs: 1\n",
		`{"model":"logreg","dataset":{"name":"synthetic"},"maxSteps":5}`,
		"optimizer: {lr: -1}\n",
		"batch_size: 0\n",
		"lr_schedule: {name: step, step_size: 10, gamma: 0.5}\n",
		"mode: ring\ncompression: {type: powersgd, rank: 2}\n",
		"seed: 18446744073709551615\n",
		"[1, 2]",
		"{{{",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		spec, err := Parse(b)
		if err != nil {
			return
		}
		norm, err := Normalize(spec, nil)
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("Normalize error is %T, want *FieldError: %v", err, err)
			}
			return
		}
		js, err := protojson.Marshal(norm)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(js)
		if err != nil {
			t.Fatalf("normalized spec does not parse back: %v\n%s", err, js)
		}
		again, err := Normalize(back, nil)
		if err != nil {
			t.Fatalf("normalized spec does not normalize again: %v\n%s", err, js)
		}
		if !proto.Equal(norm, again) {
			t.Fatalf("Normalize is not idempotent:\n%v\n%v", norm, again)
		}
	})
}
