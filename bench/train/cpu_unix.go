//go:build unix

package train

import "syscall"

// processCPU returns the CPU time (user + system) the process has used,
// in seconds, or 0 where it cannot be read.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
