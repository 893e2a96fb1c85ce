//go:build !linux

package shmring

import (
	"errors"
	"os"
	"sync/atomic"
	"time"
)

// errUnsupported: the transport needs Linux (futexes, pidfds); elsewhere
// Create fails, and the caller stays on gRPC.
var errUnsupported = errors.New("shmring: the shared-memory transport needs Linux")

const nofollow = 0

func futexWait(*atomic.Uint32, uint32, time.Duration) {}
func futexWake(*atomic.Uint32)                        {}
func mapFile(*os.File, int) ([]byte, error)           { return nil, errUnsupported }
func unmap([]byte) error                              { return nil }
func fileOwner(os.FileInfo) (int, bool)               { return 0, false }

type process struct{}

func watchProcess(int) (*process, error) { return nil, errUnsupported }
func (p *process) exited() bool          { return false }
func (p *process) close()                {}

// HostID fails: see the Linux version.
func HostID(string) (string, error) { return "", errUnsupported }

func processGone(int) bool { return false }

type bell struct{}

func bellPaths(path string) (string, string) { return path + ".data", path + ".space" }
func makeBell(string) (*bell, error)         { return nil, errUnsupported }
func openBell(string) (*bell, error)         { return nil, errUnsupported }
func (b *bell) wait(d time.Duration)         { time.Sleep(d) }
func (b *bell) ring()                        {}
func (b *bell) unlink()                      {}
func (b *bell) close()                       {}
