package server

// Every test of the package checks the lock discipline: a job store
// write, run-log record, checkpoint pin or send to a worker made while
// the calling goroutine holds the server's lock panics
// (shellLock.offLock).
func init() { lockChecks = true }

// WorkersChanged returns a channel closed at the next change of the
// worker registry (a worker connected, was lost, took or left a task):
// tests read ListWorkers after taking it and wait on it instead of
// polling.
func (s *Server) WorkersChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workersChanged
}
