// Package train measures whole-step training throughput of the models
// engine: forward, softmax cross-entropy, backward and an SGD-momentum
// step on one fixed random MNIST-shaped batch, with no data loading, the
// same loop as the PyTorch anchor (anchors/pytorch/train_throughput.py)
// so the two can be compared side by side. The CLI's `gradsync bench
// train` is a thin shell over Run.
package train

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// Options says what to measure. The zero value of every field but
// Model means its default.
type Options struct {
	Model string // architecture name, as models.Names
	// BatchSize is the images per step; default 64.
	BatchSize int
	// Threads is the number of goroutines that run each step, each on a
	// slice of the batch (models.Network.SetThreads); default 1.
	Threads int
	// BLASThreads is the number of OpenBLAS threads per GEMM
	// (kernels.SetThreads); default 1. It parallelises the GEMMs only:
	// the layers between them run on one goroutine per Threads. The
	// gonum backend ignores it and uses GOMAXPROCS.
	BLASThreads int
	// Seconds is the length of the timed run, after warm-up; default 2.
	Seconds float64
	// Backend is the GEMM backend ("openblas", "gonum", "auto"); empty
	// keeps the current one.
	Backend string
	// ActivationCheckpointing is the network's activation checkpointing
	// ("none", "blocks", "sqrt"; models.ParseCheckpointing); empty: none.
	ActivationCheckpointing string
	// Precision is the network's arithmetic ("fp32", "bf16", "fp16";
	// models.ParsePrecision); empty: fp32. The fp16 steps take no loss
	// scaling (the batch is fixed and its gradients do not underflow).
	Precision string
	// Channels, Height, Width and Classes are the input and output the
	// network is built for (CIFAR: 3, 32, 32, 10 or 100); zero: the
	// models package's defaults (1×28×28, 10 classes).
	Channels, Height, Width, Classes int
}

// Result is one measurement.
type Result struct {
	Model string `json:"model"`
	// Input is the network's C×H×W and class count, e.g. "3x32x32/10".
	Input           string  `json:"input"`
	Backend         string  `json:"gemm_backend"`
	BatchSize       int     `json:"batch_size"`
	Threads         int     `json:"threads"`
	BLASThreads     int     `json:"blas_threads"`
	ImagesPerSecond float64 `json:"images_per_second"`
	Steps           int     `json:"steps"`
	SecondsPerStep  float64 `json:"seconds_per_step"`
	// CPUSecondsPerStep is the process's CPU time (user + system, all
	// threads) per timed step, where the system reports it: on a machine
	// shared with other processes it moves much less than the wall time,
	// so two programs can be compared by it when the cores are not
	// theirs alone (PyTorch's time.process_time() is the same measure).
	CPUSecondsPerStep float64 `json:"cpu_seconds_per_step,omitempty"`
	// Precision is the arithmetic the steps ran in.
	Precision string `json:"precision"`
	// ActivationCheckpointing is the mode the steps ran with.
	ActivationCheckpointing string `json:"activation_checkpointing"`
	// PeakActivationBytes is the activation memory the network held
	// after the timed steps (models.Network.ActivationBytes): a step's peak.
	PeakActivationBytes int64 `json:"peak_activation_bytes"`
	// KernelSet is the vector kernels the process runs (kernels.KernelSet).
	KernelSet string `json:"kernel_set"`
}

// warmSteps are run untimed first: they size every buffer (no step
// allocates afterwards) and fault in its pages.
const warmSteps = 3

func (o Options) withDefaults() Options {
	if o.BatchSize == 0 {
		o.BatchSize = 64
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
	if o.BLASThreads == 0 {
		o.BLASThreads = 1
	}
	if o.Seconds == 0 {
		o.Seconds = 2
	}
	return o
}

// Validate reports options Run cannot run.
func (o Options) Validate() error {
	var errs []error
	if o.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("bench: batch size %d < 0", o.BatchSize))
	}
	if o.Threads < 0 {
		errs = append(errs, fmt.Errorf("bench: threads %d < 0", o.Threads))
	}
	if o.BLASThreads < 0 {
		errs = append(errs, fmt.Errorf("bench: BLAS threads %d < 0", o.BLASThreads))
	}
	if o.Channels < 0 || o.Height < 0 || o.Width < 0 || o.Classes < 0 {
		errs = append(errs, fmt.Errorf("bench: input %d×%d×%d with %d classes: none may be negative", o.Channels, o.Height, o.Width, o.Classes))
	}
	if o.Seconds < 0 {
		errs = append(errs, fmt.Errorf("bench: seconds %v < 0", o.Seconds))
	}
	switch o.Backend {
	case "", "auto", "openblas", "gonum":
	default:
		errs = append(errs, fmt.Errorf("bench: unknown backend %q (want auto, openblas or gonum)", o.Backend))
	}
	if _, err := models.ParseCheckpointing(o.ActivationCheckpointing); err != nil {
		errs = append(errs, fmt.Errorf("bench: %w", err))
	}
	if _, err := models.ParsePrecision(o.Precision); err != nil {
		errs = append(errs, fmt.Errorf("bench: %w", err))
	}
	return errors.Join(errs...)
}

// Run measures training throughput: after warm-up it runs steps until
// opt.Seconds have passed (at least one step) or ctx is done, whichever
// comes first, and reports images per second. It sets the process-wide
// GEMM backend and thread count for the run and restores them afterwards,
// so it must not run concurrently with other training in the process.
func Run(ctx context.Context, opt Options) (Result, error) {
	if err := opt.Validate(); err != nil {
		return Result{}, err
	}
	opt = opt.withDefaults()
	net, err := models.New(opt.Model, models.Options{Seed: 1, Channels: opt.Channels, Height: opt.Height, Width: opt.Width, Classes: opt.Classes})
	if err != nil {
		return Result{}, err
	}
	defer net.Close()
	if err := net.SetThreads(opt.Threads); err != nil {
		return Result{}, err
	}
	ck, _ := models.ParseCheckpointing(opt.ActivationCheckpointing) // checked by Validate
	if err := net.SetCheckpointing(ck); err != nil {
		return Result{}, err
	}
	prec, _ := models.ParsePrecision(opt.Precision) // checked by Validate
	if err := net.SetPrecision(prec); err != nil {
		return Result{}, err
	}
	if opt.Backend != "" {
		prev := kernels.Backend()
		if err := kernels.SetBackend(opt.Backend); err != nil {
			return Result{}, err
		}
		defer kernels.SetBackend(prev)
	}
	prevThreads := kernels.Threads()
	kernels.SetThreads(opt.BLASThreads)
	defer kernels.SetThreads(prevThreads)

	o := net.Options()
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, opt.BatchSize*net.InputSize())
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	labels := make([]int32, opt.BatchSize)
	for i := range labels {
		labels[i] = int32(r.IntN(o.Classes))
	}
	dlogits := make([]float32, opt.BatchSize*o.Classes)
	sgd := &optim.SGD{LR: 0.01, Momentum: 0.9}
	step := func() {
		net.ZeroGrad()
		models.SoftmaxCrossEntropy(net.Forward(x, opt.BatchSize, true), labels, o.Classes, dlogits)
		net.Backward(dlogits)
		sgd.Step(net.Params(), net.Grads())
	}
	for range warmSteps {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		step()
	}
	budget := time.Duration(opt.Seconds * float64(time.Second))
	start, cpu0 := time.Now(), processCPU()
	steps := 0
	var elapsed time.Duration
	for {
		step()
		steps++
		elapsed = time.Since(start)
		if elapsed >= budget || ctx.Err() != nil {
			break
		}
	}
	sec := elapsed.Seconds()
	cpu := processCPU() - cpu0
	return Result{
		Model:           opt.Model,
		Input:           fmt.Sprintf("%dx%dx%d/%d", o.Channels, o.Height, o.Width, o.Classes),
		Backend:         kernels.Backend(),
		BatchSize:       opt.BatchSize,
		Threads:         opt.Threads,
		BLASThreads:     opt.BLASThreads,
		ImagesPerSecond: float64(steps*opt.BatchSize) / sec,
		Steps:           steps,
		SecondsPerStep:  sec / float64(steps),

		CPUSecondsPerStep: max(cpu, 0) / float64(steps),

		Precision:               prec.String(),
		ActivationCheckpointing: ck.String(),
		PeakActivationBytes:     net.ActivationBytes(),
		KernelSet:               kernels.KernelSet(),
	}, nil
}
