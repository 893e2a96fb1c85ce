package models

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the calling thread's CPU time (getrusage RUSAGE_THREAD),
// less disturbed by other processes than wall-clock time.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // 1: RUSAGE_THREAD
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuTimed wraps a layer and adds its Forward's and Backward's thread CPU
// time to fw and bw.
type cpuTimed struct {
	Layer
	fw, bw *time.Duration
}

func (t *cpuTimed) Forward(x []float32, batch int, train bool) []float32 {
	t0 := threadCPU()
	y := t.Layer.Forward(x, batch, train)
	*t.fw += threadCPU() - t0
	return y
}

func (t *cpuTimed) Backward(dy []float32) []float32 {
	t0 := threadCPU()
	d := t.Layer.Backward(dy)
	*t.bw += threadCPU() - t0
	return d
}

// TestLayerCPU prints the thread CPU time of each layer's Forward and
// Backward, inside residual blocks too, per training step of
// GRADSYNC_LAYER_CPU (an architecture) at batch 64, one thread, on the
// current GEMM backend; GRADSYNC_LAYER_CPU_INPUT sets C×H×W (default the
// architecture's) and GRADSYNC_LAYER_CPU_STEPS the steps timed after 3
// warm-up steps (default 20). Skipped unless GRADSYNC_LAYER_CPU is set:
//
//	GRADSYNC_LAYER_CPU=resnet8 GRADSYNC_LAYER_CPU_INPUT=3x32x32 go test ./models -run LayerCPU -v
//
// The getrusage resolution is coarse next to a small layer's time: read
// the sums of many steps, not one layer's figure.
func TestLayerCPU(t *testing.T) {
	name := os.Getenv("GRADSYNC_LAYER_CPU")
	if name == "" {
		t.Skip("set GRADSYNC_LAYER_CPU=<architecture> to print per-layer CPU times")
	}
	opt := Options{}
	if in := os.Getenv("GRADSYNC_LAYER_CPU_INPUT"); in != "" {
		if _, err := fmt.Sscanf(in, "%dx%dx%d", &opt.Channels, &opt.Height, &opt.Width); err != nil {
			t.Fatalf("GRADSYNC_LAYER_CPU_INPUT=%q: %v", in, err)
		}
	}
	n, err := New(name, opt)
	if err != nil {
		t.Fatal(err)
	}
	type acc struct{ fw, bw time.Duration }
	accs := map[string]*acc{}
	var wrap func(ls []Layer, pre string) []Layer
	wrap = func(ls []Layer, pre string) []Layer {
		out := make([]Layer, len(ls))
		for i, l := range ls {
			key := fmt.Sprintf("%s%d %T", pre, i, l)
			if c, ok := l.(*Conv2D); ok {
				g := c.Geom
				key += fmt.Sprintf(" %dx%dx%d k%d s%d →%d wino=%v small=%v chain=%v", g.C, g.H, g.W, g.KH, g.StrideH, c.Out, c.wino, c.small, c.Chain)
			}
			if r, ok := l.(*Residual); ok {
				r.Body = wrap(r.Body, pre+strconv.Itoa(i)+".b")
				r.Shortcut = wrap(r.Shortcut, pre+strconv.Itoa(i)+".s")
				out[i] = l
				continue
			}
			a := &acc{}
			accs[key] = a
			out[i] = &cpuTimed{Layer: l, fw: &a.fw, bw: &a.bw}
		}
		return out
	}
	n.layers = wrap(n.layers, "")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const batch = 64
	x := randn(rand.New(rand.NewPCG(8, 8)), batch*n.InputSize())
	labels := make([]uint8, batch)
	classes := n.Options().Classes
	d := make([]float32, batch*classes)
	steps, _ := strconv.Atoi(os.Getenv("GRADSYNC_LAYER_CPU_STEPS"))
	if steps < 1 {
		steps = 20
	}
	for s := range steps + 3 {
		if s == 3 {
			for _, a := range accs {
				*a = acc{}
			}
		}
		n.ZeroGrad()
		SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, classes, d)
		n.Backward(d)
	}
	var keys []string
	for k := range accs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var tot time.Duration
	ms := func(v time.Duration) float64 { return float64(v) / float64(steps) / 1e6 }
	for _, k := range keys {
		a := accs[k]
		t.Logf("%-78s fwd %6.2f ms  bwd %6.2f ms", k, ms(a.fw), ms(a.bw))
		tot += a.fw + a.bw
	}
	t.Logf("total %.2f ms thread CPU per step (%s, batch %d)", ms(tot), name, batch)
}
