//go:build !cgo

package gpu

import pb "github.com/gradsync/gradsync/proto/gradsync/v1"

// Without cgo there is no NVML binding: report no GPUs.
func discover() ([]*pb.Gpu, error) { return nil, nil }
