//go:build !((linux || darwin || freebsd) && (amd64 || arm64))

package kernels

import "errors"

type openBLAS struct{ gonumGemm }

func loadOpenBLAS() (*openBLAS, error) {
	return nil, errors.New("kernels: OpenBLAS via purego is not supported on this platform")
}

func (*openBLAS) threads(int) {}
