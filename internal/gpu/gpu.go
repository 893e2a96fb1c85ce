// Package gpu finds the GPUs of this host. With cgo it asks NVML (through
// github.com/NVIDIA/go-nvml); a host without the NVIDIA driver has zero GPUs
// and that is not an error. Nothing else is called after a failed
// nvml.Init: go-nvml kills the process if you do.
package gpu

import pb "github.com/gradsync/gradsync/proto/gradsync/v1"

// Discover lists the GPUs visible here. An error means NVML was found but
// failed part-way; callers log it and carry on with what was returned.
func Discover() ([]*pb.Gpu, error) { return discover() }
