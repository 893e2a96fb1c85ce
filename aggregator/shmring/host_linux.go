package shmring

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// HostID says where this process can share segments in dir (""
// meaning DefaultDir): the kernel instance (its boot id), the
// directory's file system and inode (two containers see the same
// segments only if they share that directory), the pid namespace (the
// peers' pids must mean the same processes) and the effective user
// (segments are 0600). Two ranks whose HostIDs are equal may try this
// transport with each other; unequal ones stay on gRPC. Equal ids are a
// hint, not a promise: Connect still checks everything.
func HostID(dir string) (string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("shmring: host identity: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("shmring: host identity: %w", err)
	}
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "", fmt.Errorf("shmring: host identity: %w", err)
	}
	return fmt.Sprintf("boot=%s dev=%d ino=%d %s uid=%d", strings.TrimSpace(string(boot)), st.Dev, st.Ino, pidns, os.Geteuid()), nil
}
