//go:build race

package shmring

import (
	"sync"
	"sync/atomic"
)

// The race detector tracks synchronisation only through Go memory, not
// through atomics on a shared mapping, so in race builds every publish
// and observe of a link's counters is mirrored on an atomic in the Go
// heap shared by both ends of the link (when they are in one process, as
// in tests). Without it the happens-before edges that the counters
// establish between the collectives' buffers are invisible.
var raceShadows sync.Map // segment nonce → *atomic.Uint64

func raceShadow(nonce [16]byte) *atomic.Uint64 {
	v, _ := raceShadows.LoadOrStore(nonce, new(atomic.Uint64))
	return v.(*atomic.Uint64)
}

func (l *link) racePublish() { l.shadow.Add(1) }
func (l *link) raceObserve() { l.shadow.Load() }
func (l *link) raceForget()  { raceShadows.Delete(l.hdr.Nonce) }
