package shmring

import "syscall"

// nofollow refuses a segment name that is a symbolic link.
const nofollow = syscall.O_NOFOLLOW
