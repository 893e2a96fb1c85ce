package optim

import (
	"errors"
	"fmt"
	"math"
)

// Defaults of torch.amp.GradScaler.
const (
	DefaultInitScale      = 1 << 16
	DefaultGrowthFactor   = 2.0
	DefaultBackoffFactor  = 0.5
	DefaultGrowthInterval = 2000
)

// ScalerConfig holds a LossScaler's settings, GradScaler's constructor
// arguments; zero fields take GradScaler's defaults.
type ScalerConfig struct {
	InitScale      float32 // the first scale (2^16)
	GrowthFactor   float64 // the scale's multiplier after GrowthInterval clean steps in a row (2)
	BackoffFactor  float64 // the scale's multiplier after a step with inf/NaN gradients (0.5)
	GrowthInterval int     // clean steps in a row before the scale grows (2000)
}

func (c ScalerConfig) withDefaults() ScalerConfig {
	if c.InitScale == 0 {
		c.InitScale = DefaultInitScale
	}
	if c.GrowthFactor == 0 {
		c.GrowthFactor = DefaultGrowthFactor
	}
	if c.BackoffFactor == 0 {
		c.BackoffFactor = DefaultBackoffFactor
	}
	if c.GrowthInterval == 0 {
		c.GrowthInterval = DefaultGrowthInterval
	}
	return c
}

// Validate reports settings GradScaler rejects (growth ≤ 1, backoff ≥ 1)
// and those that make no sense for it (a scale that is not a positive
// finite number, a backoff ≤ 0, an interval < 1 or beyond int32, the type
// of torch's growth tracker). Zero fields are valid: they mean defaults.
func (c ScalerConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if !(c.InitScale > 0) || math.IsInf(float64(c.InitScale), 0) {
		errs = append(errs, fmt.Errorf("optim: loss scaler initial scale %v is not a positive finite number", c.InitScale))
	}
	if !(c.GrowthFactor > 1) || math.IsInf(c.GrowthFactor, 0) {
		errs = append(errs, fmt.Errorf("optim: loss scaler growth factor %v is not a finite number > 1", c.GrowthFactor))
	}
	if !(c.BackoffFactor > 0 && c.BackoffFactor < 1) {
		errs = append(errs, fmt.Errorf("optim: loss scaler backoff factor %v is not in (0, 1)", c.BackoffFactor))
	}
	if c.GrowthInterval < 1 || c.GrowthInterval > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("optim: loss scaler growth interval %d is not in [1, 2^31)", c.GrowthInterval))
	}
	return errors.Join(errs...)
}

// LossScaler is fp16 training's dynamic loss scaling, the algorithm of
// torch.amp.GradScaler (its _amp_update_scale_ and
// _amp_foreach_non_finite_check_and_unscale_ kernels) on a flat gradient
// buffer. A step goes:
//
//	backward of loss·Scale() → grads
//	finite := s.Unscale(grads)     // grads ·= 1/scale; any inf/NaN?
//	if s.Update(finite) { optimiser step }
//
// Update skips the step and multiplies the scale by BackoffFactor when
// the gradients held an inf or a NaN, resetting the count of clean steps
// in a row (the growth tracker); otherwise the step is taken and, when the
// count reaches GrowthInterval, the scale is multiplied by GrowthFactor
// (kept as it was if the product overflows float32) and the count starts
// again at 0. Products are computed in float64 and rounded to float32, as
// torch does. Like torch, nothing stops the scale from backing off to 0
// after about 170 non-finite steps in a row.
//
// A LossScaler is a pure state machine: no clock, no goroutines, no I/O.
// It is not safe for concurrent use.
type LossScaler struct {
	cfg     ScalerConfig
	scale   float32
	tracker int32 // clean steps in a row since the last growth or back-off
	stepped int64
	skipped int64
}

// NewLossScaler returns a scaler at cfg.InitScale (zero fields of cfg
// taking GradScaler's defaults), or cfg.Validate's error.
func NewLossScaler(cfg ScalerConfig) (*LossScaler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &LossScaler{cfg: cfg, scale: cfg.InitScale}, nil
}

// Config returns the scaler's settings, defaults filled in.
func (s *LossScaler) Config() ScalerConfig { return s.cfg }

// Scale is the factor to multiply the loss by before the backward pass.
func (s *LossScaler) Scale() float32 { return s.scale }

// Stepped and Skipped count the steps Update let through and the ones it
// skipped for inf/NaN gradients.
func (s *LossScaler) Stepped() int64 { return s.stepped }

// Skipped: see Stepped.
func (s *LossScaler) Skipped() int64 { return s.skipped }

// Unscale multiplies grads in place by the inverse of the scale (1/scale
// computed in float64 and rounded to float32, as GradScaler does; grads
// are left as they are when that is 1) and reports whether every one of
// them was finite before the multiplication. It does not change the
// scaler: pass the result to Update.
func (s *LossScaler) Unscale(grads []float32) (finite bool) {
	return Unscale(grads, float32(1/float64(s.scale)))
}

// Update records the outcome of a step whose unscaled gradients were
// finite (or not), adjusts the scale, and reports whether the optimiser
// step is to be taken.
func (s *LossScaler) Update(finite bool) (step bool) {
	if !finite {
		s.scale = float32(float64(s.scale) * s.cfg.BackoffFactor)
		s.tracker = 0
		s.skipped++
		return false
	}
	s.stepped++
	if clean := int(s.tracker) + 1; clean == s.cfg.GrowthInterval {
		if grown := float32(float64(s.scale) * s.cfg.GrowthFactor); !math.IsInf(float64(grown), 0) {
			s.scale = grown
		}
		s.tracker = 0
	} else {
		s.tracker = int32(clean)
	}
	return true
}

// ScalerState is what a checkpoint or snapshot keeps of a LossScaler:
// GradScaler's state_dict "scale" and "_growth_tracker", and the step
// counters.
type ScalerState struct {
	Scale         float32
	GrowthTracker int32
	Stepped       int64
	Skipped       int64
}

// State returns the scaler's state for a checkpoint.
func (s *LossScaler) State() ScalerState {
	return ScalerState{Scale: s.scale, GrowthTracker: s.tracker, Stepped: s.stepped, Skipped: s.skipped}
}

// Restore sets the scaler's state from a checkpoint. It refuses (and
// leaves the scaler as it was) a state no run of this configuration can
// reach: a negative or NaN scale, a growth tracker outside
// [0, GrowthInterval), negative counters. A scale of 0 (backed off that
// far) is accepted, as is +Inf (only an initial scale could be one, and
// NewLossScaler refuses those; a state file is taken at its word).
func (s *LossScaler) Restore(st ScalerState) error {
	var errs []error
	if !(st.Scale >= 0) {
		errs = append(errs, fmt.Errorf("optim: loss scaler state: scale %v < 0 or NaN", st.Scale))
	}
	if st.GrowthTracker < 0 || int(st.GrowthTracker) >= s.cfg.GrowthInterval {
		errs = append(errs, fmt.Errorf("optim: loss scaler state: growth tracker %d not in [0, %d)", st.GrowthTracker, s.cfg.GrowthInterval))
	}
	if st.Stepped < 0 || st.Skipped < 0 {
		errs = append(errs, fmt.Errorf("optim: loss scaler state: negative step counts %d stepped, %d skipped", st.Stepped, st.Skipped))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.scale, s.tracker, s.stepped, s.skipped = st.Scale, st.GrowthTracker, st.Stepped, st.Skipped
	return nil
}

// Unscale multiplies grads in place by inv (not at all when inv is 1, so
// that the values, NaN payloads included, stay as they are) and reports
// whether every value was finite before: GradScaler's fused
// _amp_foreach_non_finite_check_and_unscale_. It uses AVX-512 or AVX2
// where the CPU has them; the results are the Go code's on every CPU.
func Unscale(grads []float32, inv float32) (finite bool) {
	i, finite := unscaleSIMD(grads, inv)
	mul := inv != 1
	for ; i < len(grads); i++ {
		g := grads[i]
		if math.Float32bits(g)&0x7f800000 == 0x7f800000 { // inf or NaN
			finite = false
		}
		if mul {
			grads[i] = g * inv
		}
	}
	return finite
}
