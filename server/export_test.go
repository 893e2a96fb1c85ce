package server

// Every test of the package checks the lock discipline: a job store
// write, run-log record or checkpoint pin made while the calling
// goroutine holds the server's lock panics (shellLock.offLock).
func init() { lockChecks = true }
