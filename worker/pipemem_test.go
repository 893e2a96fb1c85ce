package worker

import (
	"os"
	"path/filepath"
	"testing"
)

// A worker offers the least of its host's memory, its cgroup's limit and
// its --memory-limit.
func TestOfferedMemory(t *testing.T) {
	if got := offeredMemory(1 << 20); got != 1<<20 {
		t.Errorf("a 1 MiB limit: offers %d", got)
	}
	host := hostMemory()
	if host == 0 {
		t.Skip("no /proc/meminfo here")
	}
	want := leastKnown(host, cgroupMemory("/sys/fs/cgroup"))
	if got := offeredMemory(0); got != want || got == 0 {
		t.Errorf("no limit: offers %d; want the host's memory or the cgroup's limit, %d", got, want)
	}
	if got := offeredMemory(1 << 62); got != want {
		t.Errorf("a limit above the host's %d bytes: offers %d; want %d", host, got, want)
	}
}

func TestCgroupMemory(t *testing.T) {
	write := func(path, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v2 := t.TempDir()
	write(filepath.Join(v2, "memory.max"), "2147483648\n")
	v2max := t.TempDir()
	write(filepath.Join(v2max, "memory.max"), "max\n")
	v1 := t.TempDir()
	write(filepath.Join(v1, "memory", "memory.limit_in_bytes"), "1073741824\n")
	v1none := t.TempDir()
	write(filepath.Join(v1none, "memory", "memory.limit_in_bytes"), "9223372036854771712\n")
	bad := t.TempDir()
	write(filepath.Join(bad, "memory.max"), "lots\n")
	for _, tc := range []struct {
		name, root string
		want       uint64
	}{
		{"v2 limit", v2, 2 << 30}, {"v2 max", v2max, 0}, {"v1 limit", v1, 1 << 30}, {"v1 unlimited", v1none, 0},
		{"unreadable", bad, 0}, {"none", t.TempDir(), 0},
	} {
		if got := cgroupMemory(tc.root); got != tc.want {
			t.Errorf("%s: %d; want %d", tc.name, got, tc.want)
		}
	}
	if got := leastKnown(0, 5, 3, 0); got != 3 {
		t.Errorf("leastKnown(0, 5, 3, 0) = %d", got)
	}
}
