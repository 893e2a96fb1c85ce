//go:build cgo

package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func discover() ([]*pb.Gpu, error) { return discoverWith(nvml.New()) }

// discoverWith queries lib, which tests replace with go-nvml's mocks.
func discoverWith(lib nvml.Interface) ([]*pb.Gpu, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		// No driver, no library, no device: zero GPUs. Call nothing else.
		return nil, nil
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: nvmlDeviceGetCount: %v", lib.ErrorString(ret))
	}
	var out []*pb.Gpu
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return out, fmt.Errorf("gpu: device %d: %v", i, lib.ErrorString(ret))
		}
		g := &pb.Gpu{Index: int32(i)}
		if name, ret := d.GetName(); ret == nvml.SUCCESS {
			g.Name = name
		}
		if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
			g.Uuid = uuid
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryBytes = mem.Total
		}
		out = append(out, g)
	}
	return out, nil
}
