package models

import (
	"encoding/binary"
	"hash"
	"hash/fnv"
	"math"
)

// Checksummer computes Checksum of a flat buffer fed in pieces, in
// order: Checksum(append(a, b...)) is a Checksummer's Sum after Add(a)
// and Add(b). A pipeline's stages feed it one stage at a time, so that
// the whole buffer is never in one place.
type Checksummer struct{ h hash.Hash64 }

// NewChecksummer starts a Checksum over an empty buffer.
func NewChecksummer() *Checksummer { return &Checksummer{h: fnv.New64a()} }

// Add feeds the next values of the buffer.
func (c *Checksummer) Add(params []float32) {
	var b [4]byte
	for _, v := range params {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		c.h.Write(b[:])
	}
}

// Sum is the Checksum of everything added so far.
func (c *Checksummer) Sum() uint64 { return c.h.Sum64() }
