package kernels

import "sync"

// The vector depthwise path (depthwise_amd64.s) covers MobileNet's
// convolutions: 3×3 kernels with padding 1 and stride 1 or 2. Stride 1
// keeps the plane's size, so an output and the nine inputs its window
// reads are a fixed flat distance apart (tap (ki, kj) at
// (ki−1)·W + kj−1): a plane is walked as one flat run of H·W outputs,
// sixteen at a time, whatever its width (a 4×4 plane is one vector),
// and a tap whose input falls outside the image is masked off lane by
// lane (the masks of each group of sixteen are precomputed per plane
// size: dwPlan). The input gradient of a stride-1 convolution is the
// stride-1 convolution of dy with the flipped kernel, and the filter
// gradient sums dy times the same nine masked inputs. Stride 2 reads the
// stride-1 result at even rows and columns: its forward computes the
// whole stride-1 plane into scratch and keeps every other value, and its
// gradients run the stride-1 kernels on dy spread over a zero plane
// (dy[r, c] at (2r, 2c)).
//
// The vector code sums a window's taps by kernel row with FMAs, and a
// filter gradient over sixteen lanes, in another order than the Go code,
// so the two agree to float32 rounding, not bit for bit (see the tests'
// bound).

// dwChunk is sixteen consecutive outputs of a plane: the flat offset of
// the first, a lane mask per tap (ki·3+kj) of the lanes whose input is
// inside the image, and the lanes that are outputs at all (the last
// chunk of a plane may be short). Its layout is read by the assembly.
type dwChunk struct {
	off  int32
	mask [10]uint16
}

// dwPlan is the chunks of an H×W plane for a 3×3 kernel with padding 1
// and stride 1.
type dwPlan struct{ chunks []dwChunk }

// dwPlans caches a dwPlan per plane size ([2]int{H, W}); plans are
// immutable once stored.
var dwPlans sync.Map

func planFor(h, w int) *dwPlan {
	key := [2]int{h, w}
	if p, ok := dwPlans.Load(key); ok {
		return p.(*dwPlan)
	}
	hw := h * w
	p := &dwPlan{chunks: make([]dwChunk, (hw+15)/16)}
	for i := range p.chunks {
		ch := &p.chunks[i]
		ch.off = int32(16 * i)
		for l := range 16 {
			o := 16*i + l
			if o >= hw {
				break
			}
			ch.mask[9] |= 1 << l
			r, c := o/w, o%w
			for ki := range 3 {
				for kj := range 3 {
					if ih, iw := r+ki-1, c+kj-1; ih >= 0 && ih < h && iw >= 0 && iw < w {
						ch.mask[ki*3+kj] |= 1 << l
					}
				}
			}
		}
	}
	v, _ := dwPlans.LoadOrStore(key, p)
	return v.(*dwPlan)
}

// dwFastGeom says whether g is one the vector path runs.
func dwFastGeom(g ConvGeom) bool {
	return g.KH == 3 && g.KW == 3 && g.PadH == 1 && g.PadW == 1 &&
		g.StrideH == g.StrideW && (g.StrideH == 1 || g.StrideH == 2)
}

// dwScratch holds one H×W plane for the stride-2 kernels.
var dwScratch = sync.Pool{New: func() any { return new([]float32) }}

func getScratch(n int) *[]float32 {
	s := dwScratch.Get().(*[]float32)
	if cap(*s) < n {
		*s = make([]float32, n)
	}
	*s = (*s)[:n]
	return s
}

// spread sets u (H×W) to zero with dy (OutH×OutW) at the even rows and
// columns: the stride-2 output gradient as a stride-1 one.
func spread(u, dy []float32, g ConvGeom) {
	clear(u)
	oh, ow := g.OutH(), g.OutW()
	for r := range oh {
		ur := u[2*r*g.W:]
		for c, v := range dy[r*ow : (r+1)*ow] {
			ur[2*c] = v
		}
	}
}

// depthwiseFast runs Depthwise on the vector kernel, reporting whether
// it did. Arguments are checked.
func depthwiseFast(dst, x, w []float32, g ConvGeom, batch int) bool {
	if !dwSIMD || !dwFastGeom(g) {
		return false
	}
	hw, p := g.H*g.W, planFor(g.H, g.W)
	if g.StrideH == 1 {
		dwPlanes(dst, x, w, g.C, batch, hw, g.W, p, false)
		return true
	}
	oh, ow := g.OutH(), g.OutW()
	s := getScratch(hw)
	defer dwScratch.Put(s)
	full := *s
	for q := range batch * g.C {
		c := q % g.C
		dwPlanes(full, x[q*hw:(q+1)*hw], w[c*9:(c+1)*9], 1, 1, hw, g.W, p, false)
		yp := dst[q*oh*ow : (q+1)*oh*ow]
		for r := range oh {
			fr := full[2*r*g.W:]
			for j := range yp[r*ow : (r+1)*ow] {
				yp[r*ow+j] = fr[2*j]
			}
		}
	}
	return true
}

// depthwiseInputGradFast runs DepthwiseInputGrad on the vector kernel,
// reporting whether it did.
func depthwiseInputGradFast(dx, dy, w []float32, g ConvGeom, batch int) bool {
	if !dwSIMD || !dwFastGeom(g) {
		return false
	}
	hw, p := g.H*g.W, planFor(g.H, g.W)
	if g.StrideH == 1 {
		dwPlanes(dx, dy, w, g.C, batch, hw, g.W, p, true)
		return true
	}
	ohw := g.OutH() * g.OutW()
	s := getScratch(hw)
	defer dwScratch.Put(s)
	u := *s
	for q := range batch * g.C {
		c := q % g.C
		spread(u, dy[q*ohw:(q+1)*ohw], g)
		dwPlanes(dx[q*hw:(q+1)*hw], u, w[c*9:(c+1)*9], 1, 1, hw, g.W, p, true)
	}
	return true
}

// depthwiseFilterGradFast runs DepthwiseFilterGrad on the vector kernel,
// reporting whether it did.
func depthwiseFilterGradFast(dw, dy, x []float32, g ConvGeom, batch int) bool {
	if !dwSIMD || !dwFastGeom(g) {
		return false
	}
	hw, p := g.H*g.W, planFor(g.H, g.W)
	if g.StrideH == 1 {
		dwGradPlanes(dw, dy, x, g.C, batch, hw, g.W, p)
		return true
	}
	ohw := g.OutH() * g.OutW()
	s := getScratch(hw)
	defer dwScratch.Put(s)
	u := *s
	for q := range batch * g.C {
		c := q % g.C
		spread(u, dy[q*ohw:(q+1)*ohw], g)
		dwGradPlanes(dw[c*9:(c+1)*9], u, x[q*hw:(q+1)*hw], 1, 1, hw, g.W, p)
	}
	return true
}
