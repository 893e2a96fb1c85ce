package train

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
)

func TestTrain(t *testing.T) {
	for _, be := range []string{"gonum", "auto"} {
		res, err := Run(context.Background(), Options{Model: "lenet5", BatchSize: 4, Seconds: 0.01, Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		if res.Model != "lenet5" || res.BatchSize != 4 || res.Threads != 1 || res.Steps < 1 ||
			res.ImagesPerSecond <= 0 || res.SecondsPerStep <= 0 || res.Backend == "" {
			t.Fatalf("result %+v", res)
		}
		// the process's CPU time: measured on Linux, never negative
		if res.CPUSecondsPerStep < 0 || runtime.GOOS == "linux" && res.CPUSecondsPerStep == 0 {
			t.Fatalf("CPU seconds per step %v", res.CPUSecondsPerStep)
		}
		if be == "gonum" && res.Backend != "gonum" {
			t.Fatalf("backend %q, want gonum", res.Backend)
		}
	}
	if kernels.Threads() != 1 {
		t.Fatalf("Run left %d BLAS threads set", kernels.Threads())
	}
}

// TestTrainThreads runs a step on two goroutines (the batch split), and
// checks that bad thread counts are errors, not crashes.
func TestTrainThreads(t *testing.T) {
	res, err := Run(context.Background(), Options{Model: "cnn", BatchSize: 5, Seconds: 0.01, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Threads != 2 || res.BLASThreads != 1 || res.Steps < 1 {
		t.Fatalf("result %+v", res)
	}
	if res, err := Run(context.Background(), Options{Model: "resnet8", BatchSize: 3, Seconds: 0.01, Threads: 2}); err != nil || res.Threads != 2 {
		t.Fatalf("resnet8 on 2 threads: %+v, %v", res, err)
	}
	if _, err := Run(context.Background(), Options{Model: "mlp", BLASThreads: -1}); err == nil {
		t.Fatal("BLAS threads -1: no error")
	}
}

func TestTrainErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Run(ctx, Options{Model: "nope"}); err == nil || !strings.Contains(err.Error(), "lenet5") {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := Run(ctx, Options{Model: "mlp", Backend: "cuda", BatchSize: -1}); err == nil ||
		!strings.Contains(err.Error(), "backend") || !strings.Contains(err.Error(), "batch") {
		t.Fatalf("bad options: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Run(cancelled, Options{Model: "mlp"}); err == nil {
		t.Fatal("cancelled context: no error")
	}
}

// BenchmarkTrain is the acceptance measurement for the models the brief
// targets; run with -benchtime 1x (each Run call times itself).
func BenchmarkTrain(b *testing.B) {
	for _, m := range []string{"mlp", "lenet5", "cnn", "resnet8", "vit-tiny"} {
		b.Run(m, func(b *testing.B) {
			for b.Loop() {
				res, err := Run(context.Background(), Options{Model: m, Seconds: 2})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(res.ImagesPerSecond, "img/s")
			}
		})
	}
}

// BenchmarkTrainCIFAR is #15's speed measurement: mobilenet (α = 1 and
// 0.5) and resnet18 on 3×32×32 inputs with 10 classes, batch 64, one
// thread. Run with -benchtime 1x; with -cpuprofile it is the profile of
// whole training steps:
//
//	go test ./bench/train -run XXX -bench TrainCIFAR/mobilenet$ -benchtime 1x -cpuprofile cpu.out
func BenchmarkTrainCIFAR(b *testing.B) {
	for _, m := range []string{"mobilenet", "mobilenet-0.5", "resnet18"} {
		b.Run(m, func(b *testing.B) {
			for b.Loop() {
				res, err := Run(context.Background(), Options{Model: m, Seconds: 5, Channels: 3, Height: 32, Width: 32, Classes: 10})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(res.ImagesPerSecond, "img/s")
			}
		})
	}
}

// TestTrainCheckpointing runs checkpointed steps and checks that they
// report their mode and hold less activation memory on resnet8, and that
// an unknown mode is an error.
func TestTrainCheckpointing(t *testing.T) {
	ctx := context.Background()
	var bytes [2]int64
	for i, mode := range []string{"none", "blocks"} {
		res, err := Run(ctx, Options{Model: "resnet8", BatchSize: 8, Seconds: 0.01, ActivationCheckpointing: mode})
		if err != nil {
			t.Fatal(err)
		}
		if res.ActivationCheckpointing != mode || res.PeakActivationBytes <= 0 || res.KernelSet == "" {
			t.Fatalf("result %+v", res)
		}
		bytes[i] = res.PeakActivationBytes
	}
	if bytes[1] >= bytes[0] {
		t.Errorf("blocks: %d activation bytes, not below %d without checkpointing", bytes[1], bytes[0])
	}
	if _, err := Run(ctx, Options{Model: "mlp", ActivationCheckpointing: "all"}); err == nil || !strings.Contains(err.Error(), "blocks") {
		t.Fatalf("unknown checkpointing: %v", err)
	}
}

// TestTrainPrecision runs bf16 and fp16 steps and checks that they say
// so, and that an unknown precision is an error.
func TestTrainPrecision(t *testing.T) {
	ctx := context.Background()
	for _, p := range []string{"bf16", "fp16"} {
		res, err := Run(ctx, Options{Model: "lenet5", BatchSize: 4, Seconds: 0.01, Precision: p})
		if err != nil {
			t.Fatal(err)
		}
		if res.Precision != p || res.Steps < 1 {
			t.Fatalf("result %+v", res)
		}
	}
	if _, err := Run(ctx, Options{Model: "mlp", Precision: "fp8"}); err == nil || !strings.Contains(err.Error(), "bf16") {
		t.Fatalf("unknown precision: %v", err)
	}
}
