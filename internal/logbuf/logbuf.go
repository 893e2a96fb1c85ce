// Package logbuf is a log destination that goroutines share: tests point
// a slog handler at a Buffer and read what the code under test logged.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer collects what is written to it, from any goroutine.
type Buffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
