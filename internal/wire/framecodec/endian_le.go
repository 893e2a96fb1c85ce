//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package framecodec

import (
	"unsafe"

	"github.com/gradsync/gradsync/internal/fsum"
)

// f32Bytes views f as its 4*len(f) bytes; the view aliases f.
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// f32Wire returns src as little-endian bytes: on this machine, a view of
// src itself (buf is not needed).
func f32Wire(_ []byte, src []float32) []byte { return f32Bytes(src) }

// readF32 fills dst from 4*len(dst) little-endian bytes of c.
func readF32(c *Cursor, dst []float32) { c.read(f32Bytes(dst)) }

// combineLE adds the little-endian float32 values in src to dst (add) or
// copies them there; len(src) == 4*len(dst). Bytes that happen to be
// 4-aligned in memory are added as float32 directly.
func combineLE(dst []float32, src []byte, add bool) {
	if len(dst) == 0 {
		return
	}
	if !add {
		copy(f32Bytes(dst), src)
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(src))
	if uintptr(p)%unsafe.Alignof(float32(0)) == 0 {
		fsum.Add(dst, unsafe.Slice((*float32)(p), len(dst)))
		return
	}
	fsum.AddLE(dst, src)
}
