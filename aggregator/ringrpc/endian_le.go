//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package ringrpc

import "unsafe"

// f32Bytes views f as its 4*len(f) bytes; the view aliases f.
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// appendF32 appends src as little-endian float32 bytes.
func appendF32(dst []byte, src []float32) []byte { return append(dst, f32Bytes(src)...) }

// readF32 fills dst from 4*len(dst) little-endian bytes of c.
func readF32(c *cursor, dst []float32) { c.read(f32Bytes(dst)) }
