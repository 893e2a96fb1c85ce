//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package ringrpc

import "github.com/gradsync/gradsync/internal/wire"

// appendF32 appends src as little-endian float32 bytes.
func appendF32(dst []byte, src []float32) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, 4*len(src))...)
	wire.PutF32(dst[n:], src)
	return dst
}

// readF32 fills dst from 4*len(dst) little-endian bytes of c.
func readF32(c *cursor, dst []float32) {
	var tmp [4 << 10]byte
	for len(dst) > 0 {
		k := min(len(dst), len(tmp)/4)
		c.read(tmp[:4*k])
		if err := wire.GetF32(dst[:k], tmp[:4*k]); err != nil {
			panic("ringrpc: " + err.Error())
		}
		dst = dst[k:]
	}
}
