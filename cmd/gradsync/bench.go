package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gradsync/gradsync/internal/bench"
	"github.com/gradsync/gradsync/models"
)

func newBenchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure speed: training throughput, collectives",
	}
	c.AddCommand(newBenchTrainCmd(g))
	return c
}

func newBenchTrainCmd(g *globals) *cobra.Command {
	var opt bench.TrainOptions
	var modelList string
	c := &cobra.Command{
		Use:     "train",
		Short:   "Images/s of forward + loss + backward + SGD step on one worker",
		Example: `  gradsync bench train --model mlp,lenet5,cnn --batch-size 64 --threads 1 --json`,
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			p := &printer{out: c.OutOrStdout(), json: g.json}
			if !g.json {
				fmt.Fprintf(c.OutOrStdout(), "%-10s %-9s %6s %7s %14s %12s\n", "MODEL", "GEMM", "BATCH", "THREADS", "IMAGES/S", "MS/STEP")
			}
			for _, m := range strings.Split(modelList, ",") {
				o := opt
				o.Model = strings.TrimSpace(m)
				r, err := bench.Train(c.Context(), o)
				if err != nil {
					return err
				}
				if g.json {
					p.jsonLine(r)
					continue
				}
				fmt.Fprintf(c.OutOrStdout(), "%-10s %-9s %6d %7d %14s %12.3f\n", r.Model, r.Backend, r.BatchSize, r.Threads,
					thousands(r.ImagesPerSecond), 1000*r.SecondsPerStep)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&modelList, "model", "mlp", "architecture(s), comma-separated: "+strings.Join(models.Names(), ", "))
	f.IntVar(&opt.BatchSize, "batch-size", 64, "images per step")
	f.IntVar(&opt.Threads, "threads", 1, "BLAS threads")
	f.Float64Var(&opt.Seconds, "seconds", 2, "timed seconds per model (after warm-up)")
	f.StringVar(&opt.Backend, "gemm", "", "GEMM backend: auto, openblas or gonum (default: as selected at start)")
	return c
}
