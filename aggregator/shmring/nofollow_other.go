//go:build !linux

package shmring

const nofollow = 0
