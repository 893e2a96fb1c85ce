package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gradsync/gradsync/bench/allreduce"
	"github.com/gradsync/gradsync/bench/train"
	"github.com/gradsync/gradsync/models"
)

func newBenchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure speed: training throughput, collectives",
	}
	c.AddCommand(newBenchTrainCmd(g), newBenchAllReduceCmd(g), newBenchAllReduceChildCmd())
	return c
}

// allReduceChild is the hidden subcommand each rank process of
// `bench allreduce` runs.
const allReduceChild = "allreduce-rank"

// algoEnv overrides the all-reduce algorithm: a worker's (worker.Config.
// Algorithm, for `gradsync worker` and `gradsync local`), and the default
// of `bench allreduce --algorithm`.
const algoEnv = "GRADSYNC_ALGO"

// cpuProfileEnv passes --cpuprofile's prefix to the rank processes.
const cpuProfileEnv = "GRADSYNC_BENCH_CPUPROFILE"

func newBenchAllReduceCmd(g *globals) *cobra.Command {
	var o allreduce.ParentOptions
	var sizes, cpuProfile, algos string
	c := &cobra.Command{
		Use:   "allreduce",
		Short: "Ring all-reduce bandwidth over gRPC between N processes on loopback (nccl-tests columns)",
		Example: `  gradsync bench allreduce --ranks 2 --sizes 1M,4M,16M,64M --json
  gradsync bench allreduce --ranks 4 --transport mem
  gradsync bench allreduce --ranks 3 --transport shm-pairs --algorithm ring,halving_doubling,tree --sizes 4K,64K,1M`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var err error
			if o.Sizes, err = allreduce.ParseSizes(sizes); err != nil {
				return err
			}
			if o.Algorithms, err = allreduce.ParseAlgorithms(algos); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Stderr = c.ErrOrStderr()
			if cpuProfile != "" {
				o.Env = append(o.Env, cpuProfileEnv+"="+cpuProfile)
			}
			rs, err := allreduce.RunParent(c.Context(), o, exe, []string{"bench", allReduceChild})
			if err != nil {
				return err
			}
			if g.json {
				return allreduce.WriteJSON(c.OutOrStdout(), rs)
			}
			return allreduce.WriteTable(c.OutOrStdout(), rs)
		},
	}
	f := c.Flags()
	f.IntVar(&o.Ranks, "ranks", 2, "world size: this many processes (grpc) or in-memory ranks (mem)")
	f.StringVar(&sizes, "sizes", "1M,4M,16M,64M", "buffer sizes in bytes (K, M, G suffixes: powers of 1024)")
	f.StringVar(&o.Transport, "transport", allreduce.TransportGRPC, "grpc (separate processes, TCP on loopback), shm (separate processes, their gRPC ring moved to shared memory), auto (shm where the ranks can negotiate it, else grpc; each line names the one used, stderr says why), mem, or shm-pairs (ranks as goroutines of this process, a two-rank shared-memory ring per pair: every algorithm)")
	f.StringVar(&algos, "algorithm", cmp.Or(os.Getenv(algoEnv), "ring"), "all-reduce algorithm (default: $GRADSYNC_ALGO, else ring): ring, halving_doubling, tree or auto (the cost model's pick per size); a comma-separated list times them interleaved, one line each. Algorithms other than ring need --transport mem or shm-pairs")
	f.BoolVar(&o.Calibrate, "calibrate", false, "mem, shm-pairs: fit the cost model (α, β) to probe messages between ranks 0 and 1 first, instead of the transport's constants")
	f.IntVar(&o.Reps, "reps", 15, "timed repetitions per size (the median is reported)")
	f.IntVar(&o.Warmup, "warmup", 3, "untimed repetitions first")
	f.IntVar(&o.FrameElems, "frame-elems", 0, "float32 values per ring frame (0: the collectives' default, 1 MiB of data)")
	f.IntVar(&o.InboxFrames, "inbox-frames", 0, "grpc: frames a rank may hold received but not yet reduced (0: ringrpc's default)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "grpc, shm: write each rank's CPU profile to this `prefix` followed by the rank and .pprof")
	return c
}

func newBenchAllReduceChildCmd() *cobra.Command {
	return &cobra.Command{
		Use:                allReduceChild,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(c *cobra.Command, args []string) error {
			co, err := allreduce.ParseChildArgs(args)
			if err != nil {
				return err
			}
			if co.FallBack && co.Rank == 0 { // --transport auto: say which data plane, and why
				co.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			if prefix := os.Getenv(cpuProfileEnv); prefix != "" {
				f, err := os.Create(fmt.Sprintf("%s%d.pprof", prefix, co.Rank))
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return allreduce.RunChild(c.Context(), co)
		},
	}
}

func newBenchTrainCmd(g *globals) *cobra.Command {
	var opt train.Options
	var modelList, input string
	c := &cobra.Command{
		Use:     "train",
		Short:   "Images/s of forward + loss + backward + SGD step on one worker",
		Example: `  gradsync bench train --model mlp,lenet5,cnn --batch-size 64 --threads 1 --json`,
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			p := &printer{out: c.OutOrStdout(), json: g.json}
			if input != "" {
				var err error
				if opt.Channels, opt.Height, opt.Width, err = parseInput(input); err != nil {
					return err
				}
			}
			if !g.json {
				fmt.Fprintf(c.OutOrStdout(), "%-10s %-11s %-9s %6s %7s %5s %-5s %-7s %14s %12s %12s %s\n",
					"MODEL", "INPUT", "GEMM", "BATCH", "THREADS", "BLAS", "PREC", "CKPT", "IMAGES/S", "MS/STEP", "ACT-MIB", "KERNELS")
			}
			for _, m := range strings.Split(modelList, ",") {
				o := opt
				o.Model = strings.TrimSpace(m)
				r, err := train.Run(c.Context(), o)
				if err != nil {
					return err
				}
				if g.json {
					p.jsonLine(r)
					continue
				}
				fmt.Fprintf(c.OutOrStdout(), "%-10s %-11s %-9s %6d %7d %5d %-5s %-7s %14s %12.3f %12.2f %s\n", r.Model, r.Input, r.Backend, r.BatchSize, r.Threads, r.BLASThreads,
					r.Precision, r.ActivationCheckpointing, thousands(r.ImagesPerSecond), 1000*r.SecondsPerStep, float64(r.PeakActivationBytes)/(1<<20), r.KernelSet)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&modelList, "model", "mlp", "architecture(s), comma-separated: "+strings.Join(models.Names(), ", "))
	f.IntVar(&opt.BatchSize, "batch-size", 64, "images per step")
	f.StringVar(&input, "input", "", "input CxHxW, e.g. 3x32x32 for CIFAR (default 1x28x28)")
	f.IntVar(&opt.Classes, "classes", 0, "output classes, e.g. 10 or 100 for CIFAR (default 10)")
	f.IntVar(&opt.Threads, "threads", 1, "goroutines per step, each on a slice of the batch")
	f.IntVar(&opt.BLASThreads, "blas-threads", 1, "OpenBLAS threads per GEMM")
	f.Float64Var(&opt.Seconds, "seconds", 2, "timed seconds per model (after warm-up)")
	f.StringVar(&opt.Backend, "gemm", "", "GEMM backend: auto, openblas or gonum (default: as selected at start)")
	f.StringVar(&opt.ActivationCheckpointing, "activation-checkpointing", "none",
		"keep only segment inputs in forward and recompute in backward: none, blocks or sqrt")
	f.StringVar(&opt.Precision, "precision", "fp32", "matrix products' operands: fp32, bf16 or fp16 (float32 accumulation and master weights)")
	return c
}

// parseInput parses --input CxHxW.
func parseInput(s string) (c, h, w int, err error) {
	parts := strings.Split(s, "x")
	if len(parts) == 3 {
		var v [3]int
		for i, p := range parts {
			if v[i], err = strconv.Atoi(p); err != nil || v[i] < 1 {
				break
			}
		}
		if err == nil && v[0] > 0 && v[1] > 0 && v[2] > 0 {
			return v[0], v[1], v[2], nil
		}
	}
	return 0, 0, 0, fmt.Errorf("--input %q: want CxHxW with positive sides, e.g. 3x32x32", s)
}

const cpuProfileHelp = "write this process's CPU profile (the coordinator's and workers' Go code, not an entrypoint's script) to this `file` (go tool pprof)"

// startCPUProfile starts writing the process's CPU profile to path (""
// writes none); stop ends it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
