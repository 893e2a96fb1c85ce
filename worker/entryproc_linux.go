package worker

import "syscall"

// dieWithWorker makes the kernel kill the command when the worker dies
// (kill -9 of the worker included), so a script never outlives the worker
// that supervises it. (Pdeathsig fires when the thread that started the
// command exits; the Go runtime does not end threads that did not lock
// themselves, and exec.Cmd's Start does not.)
func dieWithWorker(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
