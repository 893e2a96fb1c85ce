package worker

import "testing"

// A worker offers its --memory-limit (the host's memory where that is
// less), and nothing in particular without one.
func TestOfferedMemory(t *testing.T) {
	if got := offeredMemory(0); got != 0 {
		t.Errorf("no limit: offers %d; want 0 (not reported)", got)
	}
	if got := offeredMemory(1 << 20); got != 1<<20 {
		t.Errorf("a 1 MiB limit: offers %d", got)
	}
	host := hostMemory()
	if host == 0 {
		t.Skip("no /proc/meminfo here")
	}
	if got := offeredMemory(1 << 62); got != host {
		t.Errorf("a limit above the host's %d bytes: offers %d; want the host's", host, got)
	}
}
