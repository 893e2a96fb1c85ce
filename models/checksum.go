package models

import (
	"encoding/binary"
	"hash/fnv"
	"math"
)

// Checksum is FNV-1a (64-bit) over the little-endian bytes of params'
// float32 bits: JobResult.parameter_checksum, so runs (and shard counts,
// refactors, meshes) that computed the same parameters can be compared
// bit for bit.
func Checksum(params []float32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, v := range params {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return h.Sum64()
}
