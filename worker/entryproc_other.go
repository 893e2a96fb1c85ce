//go:build !linux

package worker

import "syscall"

// dieWithWorker: only Linux can tie a child's life to its parent's; on
// other systems the command may outlive a worker killed with SIGKILL.
func dieWithWorker(*syscall.SysProcAttr) {}
