package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
)

// errForeignPeer: a process of another user connected to the socket.
var errForeignPeer = errors.New("agent: peer is another user")

// peerListener checks who connects, beside the socket's file modes (a
// second lock on the same door: a mode changed by mistake, a socket
// passed on, a directory made readable): Accept hands on only
// connections whose peer process runs as uid (the kernel's SO_PEERCRED
// on Linux), closing and logging every other one, and keeps accepting.
// Where the kernel cannot say (other systems), the file modes are the
// only check.
type peerListener struct {
	net.Listener
	uid int
	log *slog.Logger
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, pid, err := peerCred(c)
		if err == nil && uid == l.uid {
			return c, nil
		}
		if err == nil {
			err = fmt.Errorf("%w: uid %d (pid %d), want uid %d", errForeignPeer, uid, pid, l.uid)
		}
		l.log.Warn("agent: connection refused", "err", err)
		c.Close()
	}
}

// ownUID is the uid a peer must have.
func ownUID() int { return os.Getuid() }
