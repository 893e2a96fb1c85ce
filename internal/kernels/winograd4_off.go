//go:build !winograd4

package kernels

// Without the build tag winograd4, F(4×4, 3×3) (winograd4.go) is not
// compiled: it measured slower than F(2×2, 3×3) and is switched off in
// models. These stand-ins keep models' calls compiling; models never
// reaches them, because Winograd4Built is false.

// Winograd4Built says this build has F(4×4, 3×3): false without -tags
// winograd4.
const Winograd4Built = false

const noWinograd4 = "kernels: F(4×4, 3×3) is compiled only with -tags winograd4"

// Winograd4Filter panics: see Winograd4Built.
func Winograd4Filter(u, w []float32, out, c int) { panic(noWinograd4) }

// Winograd4FilterGrad panics: see Winograd4Built.
func Winograd4FilterGrad(dw, du []float32, out, c int) { panic(noWinograd4) }

// Winograd4Input panics: see Winograd4Built.
func Winograd4Input(v []float32, s int, x []float32, g ConvGeom, batch int) { panic(noWinograd4) }

// Winograd4InputGrad panics: see Winograd4Built.
func Winograd4InputGrad(dx, dv []float32, s int, g ConvGeom, batch int) { panic(noWinograd4) }

// Winograd4Output panics: see Winograd4Built.
func Winograd4Output(y, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	panic(noWinograd4)
}

// Winograd4OutputGrad panics: see Winograd4Built.
func Winograd4OutputGrad(dm []float32, s int, dy []float32, g ConvGeom, out, batch int) {
	panic(noWinograd4)
}

// Winograd4OutputPool panics: see Winograd4Built.
func Winograd4OutputPool(y []float32, arg []uint8, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	panic(noWinograd4)
}

// Winograd4OutputPoolGrad panics: see Winograd4Built.
func Winograd4OutputPoolGrad(dm []float32, s int, dy []float32, arg []uint8, y, db []float32, g ConvGeom, out, batch int) {
	panic(noWinograd4)
}
