package agent

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCred is the uid and pid of the process at the other end of c, a
// Unix socket connection (SO_PEERCRED: what the kernel recorded when it
// connected).
func peerCred(c net.Conn) (uid, pid int, err error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, 0, fmt.Errorf("agent: peer credentials: %T is not a Unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("agent: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, 0, fmt.Errorf("agent: peer credentials: %w", err)
	}
	if serr != nil {
		return 0, 0, fmt.Errorf("agent: peer credentials: %w", serr)
	}
	return int(cred.Uid), int(cred.Pid), nil
}
