//go:build !unix

package train

// processCPU is not measured on this system.
func processCPU() float64 { return 0 }
