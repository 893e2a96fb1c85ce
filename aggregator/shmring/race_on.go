//go:build race

package shmring

import "sync/atomic"

// The race detector tracks synchronisation only through Go memory, not
// through atomics on a shared mapping, and never across processes. In
// race builds every publish and observe of a link counter is therefore
// mirrored on one atomic in this process's heap. One for all links,
// because the ordering a ring relies on runs through other ranks: a
// rank's receive of chunk c follows its own send of the chunk before it
// only by way of the rest of the ring, which may be other processes.
var raceShadow atomic.Uint64

func (l *link) racePublish() { raceShadow.Add(1) }
func (l *link) raceObserve() { raceShadow.Load() }
