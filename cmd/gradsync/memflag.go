package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

const memoryLimitHelp = "cap the memory this worker offers to a task, e.g. 2GiB, 512MiB, 1.5GB (binary KiB/MiB/GiB/TiB or decimal KB/MB/GB/TB; plain bytes without a unit); the coordinator places a rank here only if what it holds (its pipeline stage, or the whole model: parameters, gradients, optimiser state, activations) fits, and fails a job no worker can hold naming what does not fit. Default: the host's memory or the cgroup's limit, whichever is less (`gradsync workers` shows what each worker offers)"

// parseMemory reads a --memory-limit: a number and an optional unit; ""
// is 0 (no limit).
func parseMemory(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult, num := 1.0, s
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			mult, num = u.mult, strings.TrimSpace(rest)
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("%q is not a memory size; want a positive number and a unit such as 2GiB, 512MiB or 1.5GB", s)
	}
	b := v * mult
	if b < 1 || b >= math.MaxUint64/2 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return uint64(b), nil
}
