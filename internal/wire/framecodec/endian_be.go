//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package framecodec

import (
	"slices"

	"github.com/gradsync/gradsync/internal/fsum"
	"github.com/gradsync/gradsync/internal/wire"
)

// f32Wire returns src as little-endian bytes, converted into buf (grown
// as needed).
func f32Wire(buf []byte, src []float32) []byte {
	buf = slices.Grow(buf[:0], 4*len(src))[:4*len(src)]
	wire.PutF32(buf, src)
	return buf
}

// readF32 fills dst from 4*len(dst) little-endian bytes of c.
func readF32(c *Cursor, dst []float32) {
	var tmp [4 << 10]byte
	for len(dst) > 0 {
		k := min(len(dst), len(tmp)/4)
		c.read(tmp[:4*k])
		if err := wire.GetF32(dst[:k], tmp[:4*k]); err != nil {
			panic("framecodec: " + err.Error())
		}
		dst = dst[k:]
	}
}

// combineLE adds the little-endian float32 values in src to dst (add) or
// copies them there; len(src) == 4*len(dst).
func combineLE(dst []float32, src []byte, add bool) {
	if add {
		fsum.AddLE(dst, src)
		return
	}
	if err := wire.GetF32(dst, src); err != nil {
		panic("framecodec: " + err.Error())
	}
}
