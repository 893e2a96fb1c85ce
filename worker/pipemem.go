package worker

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// offeredMemory is the memory a worker started with --memory-limit
// offers to a task: limit, or the host's memory (MemTotal of
// /proc/meminfo) where that is less. Without a limit it offers nothing
// in particular (0: any job is placed here, as before memory was
// reported): the coordinator's estimate of a job's need is an upper
// bound, which should not refuse by default a job that would fit.
func offeredMemory(limit uint64) uint64 {
	if limit == 0 {
		return 0
	}
	if host := hostMemory(); host > 0 {
		return min(host, limit)
	}
	return limit
}

// hostMemory reads MemTotal from /proc/meminfo (0 when it cannot).
func hostMemory() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0
		}
		return kb * 1024
	}
	return 0
}
