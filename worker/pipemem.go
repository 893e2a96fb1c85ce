package worker

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// offeredMemory is the memory a worker offers to a task, which it
// reports in its Hello: the least of its host's memory (MemTotal of
// /proc/meminfo), its cgroup's memory limit, and limit (--memory-limit;
// 0: none). 0 only when none of them can be told (not reported: any job
// is placed here). The coordinator places a rank only where its need
// (jobspec.MemoryNeeds, an upper bound) fits.
func offeredMemory(limit uint64) uint64 {
	return leastKnown(limit, hostMemory(), cgroupMemory("/sys/fs/cgroup"))
}

// leastKnown is the least of the non-zero values (0: none).
func leastKnown(vs ...uint64) uint64 {
	var m uint64
	for _, v := range vs {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
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

// unlimitedCgroup: cgroup v1 reports "no limit" as a huge number (the
// largest page-aligned int64); anything from here up counts as none.
const unlimitedCgroup = 1 << 60

// cgroupMemory is the memory limit of this process's cgroup under root
// (/sys/fs/cgroup): v2's memory.max or v1's memory.limit_in_bytes of the
// process's own cgroup (from /proc/self/cgroup), else of the root's; 0
// when there is none or it cannot be read.
func cgroupMemory(root string) uint64 {
	var paths []string
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			if rest, ok := strings.CutPrefix(l, "0::"); ok { // v2: "0::/path"
				paths = append(paths, filepath.Join(root, rest, "memory.max"))
			}
			if _, rest, ok := strings.Cut(l, ":memory:"); ok { // v1: "4:memory:/path"
				paths = append(paths, filepath.Join(root, "memory", rest, "memory.limit_in_bytes"))
			}
		}
	}
	paths = append(paths, filepath.Join(root, "memory.max"), filepath.Join(root, "memory", "memory.limit_in_bytes"))
	for _, p := range paths {
		if v, ok := readLimit(p); ok {
			return v
		}
	}
	return 0
}

// readLimit reads a cgroup memory limit file: a byte count, or "max"
// (none, 0); ok is false when the file is missing or unreadable.
func readLimit(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	if v >= unlimitedCgroup {
		return 0, true
	}
	return v, true
}
