package checkpoint

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// Name prefixes of per-parameter optimiser state in State.Optim: the
// prefix, then the parameter's PyTorch name.
const (
	MomentumPrefix = "momentum_buffer." // SGD's momentum buffer
	AdamMPrefix    = "adam.m."          // Adam's first moment (exp_avg)
	AdamVPrefix    = "adam.v."          // Adam's second moment (exp_avg_sq)
)

// PutFlat stores flat, a buffer laid out as segs describe (the network's
// parameter layout), in dst as one F32 tensor per segment named
// prefix+segment name, with the segment's shape. The tensors are copies.
func PutFlat(dst map[string]Tensor, prefix string, segs []models.Segment, flat []float32) {
	if n := flatLen(segs); len(flat) != n {
		panic(fmt.Sprintf("checkpoint: PutFlat: flat has length %d, segments cover %d", len(flat), n))
	}
	for _, s := range segs {
		dst[prefix+s.Name] = models.F32Tensor(s.Shape, flat[s.Offset:s.Offset+s.Len])
	}
}

// GetFlat is PutFlat's inverse: it returns a new flat buffer filled from
// the tensors named prefix+segment name in src. Every segment must be
// present as F32 with its exact shape, and no other name with that
// prefix may appear.
func GetFlat(src map[string]Tensor, prefix string, segs []models.Segment) ([]float32, error) {
	flat := make([]float32, flatLen(segs))
	want := make(map[string]bool, len(segs))
	var errs []error
	for _, s := range segs {
		name := prefix + s.Name
		want[name] = true
		t, ok := src[name]
		if !ok {
			errs = append(errs, fmt.Errorf("missing tensor %q", name))
			continue
		}
		if !slices.Equal(t.Shape, s.Shape) {
			errs = append(errs, fmt.Errorf("%s: shape %v, want %v", name, t.Shape, s.Shape))
			continue
		}
		v, err := t.Float32s()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		copy(flat[s.Offset:s.Offset+s.Len], v)
	}
	for _, name := range slices.Sorted(maps.Keys(src)) {
		if strings.HasPrefix(name, prefix) && !want[name] {
			errs = append(errs, fmt.Errorf("unexpected tensor %q", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return flat, nil
}

// hasPrefix reports whether any name in m starts with prefix.
func hasPrefix(m map[string]Tensor, prefix string) bool {
	for name := range m {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// flatLen is the length of the flat buffer segs tile.
func flatLen(segs []models.Segment) int {
	n := 0
	for _, s := range segs {
		n = max(n, s.Offset+s.Len)
	}
	return n
}

// CaptureSGD records o's state in s: Meta.Optimizer and, when o has a
// momentum buffer, its segments (segs: the network's Segments) as
// momentum_buffer.<param> in s.Optim.
func (s *State) CaptureSGD(o *optim.SGD, segs []models.Segment) {
	s.Meta.Optimizer = Optimizer{Name: "sgd"}
	if s.Optim == nil {
		s.Optim = map[string]Tensor{}
	}
	if buf := o.State(); buf != nil {
		PutFlat(s.Optim, MomentumPrefix, segs, buf)
	}
}

// RestoreSGD sets o's state from s, as CaptureSGD recorded it; without
// momentum tensors the momentum is forgotten, as before a first step.
func (s *State) RestoreSGD(o *optim.SGD, segs []models.Segment) error {
	if n := s.Meta.Optimizer.Name; n != "sgd" {
		return fmt.Errorf("checkpoint: RestoreSGD: the checkpoint holds optimiser %q", n)
	}
	if !hasPrefix(s.Optim, MomentumPrefix) {
		o.SetState(nil)
		return nil
	}
	buf, err := GetFlat(s.Optim, MomentumPrefix, segs)
	if err != nil {
		return err
	}
	o.SetState(buf)
	return nil
}

// CaptureAdam records o's state in s: Meta.Optimizer ("adam", or "adamw"
// for decoupled weight decay, with the step count) and, after the first
// step, the moments as adam.m.<param> and adam.v.<param> in s.Optim.
func (s *State) CaptureAdam(o *optim.Adam, segs []models.Segment) {
	m, v, steps := o.State()
	s.Meta.Optimizer = Optimizer{Name: adamName(o), Steps: int64(steps)}
	if s.Optim == nil {
		s.Optim = map[string]Tensor{}
	}
	if m != nil {
		PutFlat(s.Optim, AdamMPrefix, segs, m)
		PutFlat(s.Optim, AdamVPrefix, segs, v)
	}
}

// RestoreAdam sets o's state from s, as CaptureAdam recorded it. The
// checkpoint's optimiser must be the same kind (Adam or AdamW) as o.
func (s *State) RestoreAdam(o *optim.Adam, segs []models.Segment) error {
	if n, want := s.Meta.Optimizer.Name, adamName(o); n != want {
		return fmt.Errorf("checkpoint: RestoreAdam: the checkpoint holds optimiser %q, want %q", n, want)
	}
	if !hasPrefix(s.Optim, AdamMPrefix) && !hasPrefix(s.Optim, AdamVPrefix) {
		o.SetState(nil, nil, 0)
		return nil
	}
	m, err := GetFlat(s.Optim, AdamMPrefix, segs)
	if err != nil {
		return err
	}
	v, err := GetFlat(s.Optim, AdamVPrefix, segs)
	if err != nil {
		return err
	}
	o.SetState(m, v, int(s.Meta.Optimizer.Steps))
	return nil
}

func adamName(o *optim.Adam) string {
	if o.Decoupled {
		return "adamw"
	}
	return "adam"
}

// CaptureOptimizer stores opt's state, whichever optimiser it is (*optim.SGD
// or *optim.Adam; any other keeps no state and stores nothing).
func (s *State) CaptureOptimizer(opt any, segs []models.Segment) {
	switch o := opt.(type) {
	case *optim.SGD:
		s.CaptureSGD(o, segs)
	case *optim.Adam:
		s.CaptureAdam(o, segs)
	}
}

// RestoreOptimizer loads opt's state (CaptureOptimizer's counterpart).
func (s *State) RestoreOptimizer(opt any, segs []models.Segment) error {
	switch o := opt.(type) {
	case *optim.SGD:
		return s.RestoreSGD(o, segs)
	case *optim.Adam:
		return s.RestoreAdam(o, segs)
	}
	return nil
}
