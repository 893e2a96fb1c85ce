package worker

import "syscall"

// dieWithWorker makes the kernel kill the command when the worker dies
// (kill -9 of the worker included), so a script never outlives the worker
// that supervises it. (Pdeathsig fires when the thread that started the
// command exits: entryProcess.run keeps its goroutine locked to that
// thread until the command has exited.)
func dieWithWorker(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
