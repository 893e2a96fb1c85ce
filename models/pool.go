package models

import "fmt"

// PoolGeom is a pooling window over (C, H, W) planes: K×K windows moved by
// Stride, no padding, output sizes rounded down (PyTorch's defaults with
// ceil_mode false).
type PoolGeom struct {
	C, H, W   int
	K, Stride int
}

// OutH is (H − K)/Stride + 1.
func (g PoolGeom) OutH() int { return (g.H-g.K)/g.Stride + 1 }

// OutW is (W − K)/Stride + 1.
func (g PoolGeom) OutW() int { return (g.W-g.K)/g.Stride + 1 }

// OutSize is C·OutH·OutW, the output values per sample.
func (g PoolGeom) OutSize() int { return g.C * g.OutH() * g.OutW() }

func (g PoolGeom) check(op string) {
	if g.C < 1 || g.H < 1 || g.W < 1 || g.K < 1 || g.Stride < 1 || g.K > g.H || g.K > g.W {
		panic(fmt.Sprintf("models: %s: invalid geometry %+v", op, g))
	}
}

// MaxPool2D is torch.nn.MaxPool2d(K, Stride): x is (batch, C, H, W) and y is
// (batch, C, OutH, OutW). The first maximum of a window wins ties, and a
// NaN in a window propagates, as in PyTorch.
type MaxPool2D struct {
	Geom PoolGeom
	// ReLU fuses a preceding ReLU: y = max(0, maxpool(x)), which equals
	// maxpool(relu(x)), gradients included, on a quarter of the values.
	ReLU bool

	batch int
	y, dx []float32 // owned
	arg   []int32   // owned: per output, the index of its maximum within the sample's input
}

// NewMaxPool2D returns a max pool over (c, h, w) inputs.
func NewMaxPool2D(g PoolGeom) *MaxPool2D {
	g.check("NewMaxPool2D")
	return &MaxPool2D{Geom: g}
}

// Forward returns the window maxima and records where they were.
func (l *MaxPool2D) Forward(x []float32, batch int, train bool) []float32 {
	g := l.Geom
	in := g.C * g.H * g.W
	if batch < 1 || len(x) != batch*in {
		panic(fmt.Sprintf("models: MaxPool2D.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, g.C, g.H, g.W))
	}
	l.batch = batch
	oh, ow := g.OutH(), g.OutW()
	l.y = grow(l.y, batch*g.C*oh*ow)
	if cap(l.arg) < len(l.y) {
		l.arg = make([]int32, len(l.y))
	}
	l.arg = l.arg[:len(l.y)]
	o := 0
	for n := range batch {
		xn := x[n*in : (n+1)*in]
		for c := range g.C {
			base := c * g.H * g.W
			if g.K == 2 && g.Stride == 2 {
				for i := range oh {
					r0 := base + 2*i*g.W
					r1 := r0 + g.W
					y := l.y[o : o+ow]
					arg := l.arg[o : o+ow]
					x0 := xn[r0 : r0+2*ow]
					x1 := xn[r1 : r1+2*ow]
					for j := range y {
						// Branch-free: which element is largest is random,
						// so a branch per comparison mispredicts often.
						a0, a1, b0, b1 := x0[2*j], x0[2*j+1], x1[2*j], x1[2*j+1]
						m := max(max(a0, a1), max(b0, b1)) // NaN-propagating
						k := int32(g.W + 1)                // the first of the window equal to m
						if b0 == m {
							k = int32(g.W)
						}
						if a1 == m {
							k = 1
						}
						if a0 == m {
							k = 0
						}
						y[j], arg[j] = m, int32(r0+2*j)+k
					}
					o += ow
				}
				continue
			}
			for i := range oh {
				for j := range ow {
					a := base + i*g.Stride*g.W + j*g.Stride
					best, bi := xn[a], a
					for ki := range g.K {
						r := a + ki*g.W
						for kj := range g.K {
							if v := xn[r+kj]; v > best || v != v {
								best, bi = v, r+kj
							}
						}
					}
					l.y[o], l.arg[o] = best, int32(bi)
					o++
				}
			}
		}
	}
	if l.ReLU {
		for i, v := range l.y {
			l.y[i] = max(v, 0)
		}
	}
	return l.y
}

// Backward routes each dy to the position of its window's maximum.
func (l *MaxPool2D) Backward(dy []float32) []float32 {
	if len(dy) != len(l.y) || l.batch == 0 {
		panic(fmt.Sprintf("models: MaxPool2D.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	g := l.Geom
	in := g.C * g.H * g.W
	out := g.OutSize()
	l.dx = grow(l.dx, l.batch*in)
	clear(l.dx)
	for n := range l.batch {
		dxn := l.dx[n*in : (n+1)*in]
		arg := l.arg[n*out : (n+1)*out]
		dyn := dy[n*out : (n+1)*out]
		if l.ReLU {
			y := l.y[n*out : (n+1)*out]
			for i, d := range dyn {
				dxn[arg[i]] += reluGate(d, y[i])
			}
			continue
		}
		for i, d := range dyn {
			dxn[arg[i]] += d
		}
	}
	return l.dx
}

// AvgPool2D is torch.nn.AvgPool2d(K, Stride) without padding: each output
// is the mean of its K×K window. x is (batch, C, H, W), y is (batch, C,
// OutH, OutW).
type AvgPool2D struct {
	Geom PoolGeom

	batch int
	y, dx []float32 // owned
}

// NewAvgPool2D returns an average pool over (c, h, w) inputs.
func NewAvgPool2D(g PoolGeom) *AvgPool2D {
	g.check("NewAvgPool2D")
	return &AvgPool2D{Geom: g}
}

// Forward returns the window means.
func (l *AvgPool2D) Forward(x []float32, batch int, train bool) []float32 {
	g := l.Geom
	in := g.C * g.H * g.W
	if batch < 1 || len(x) != batch*in {
		panic(fmt.Sprintf("models: AvgPool2D.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, g.C, g.H, g.W))
	}
	l.batch = batch
	oh, ow := g.OutH(), g.OutW()
	l.y = grow(l.y, batch*g.C*oh*ow)
	inv := 1 / float32(g.K*g.K)
	o := 0
	for p := range batch * g.C {
		plane := x[p*g.H*g.W : (p+1)*g.H*g.W]
		for i := range oh {
			for j := range ow {
				var s float32
				a := i*g.Stride*g.W + j*g.Stride
				for ki := range g.K {
					for _, v := range plane[a+ki*g.W : a+ki*g.W+g.K] {
						s += v
					}
				}
				l.y[o] = s * inv
				o++
			}
		}
	}
	return l.y
}

// Backward spreads each dy evenly over its window.
func (l *AvgPool2D) Backward(dy []float32) []float32 {
	if len(dy) != len(l.y) || l.batch == 0 {
		panic(fmt.Sprintf("models: AvgPool2D.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	g := l.Geom
	oh, ow := g.OutH(), g.OutW()
	l.dx = grow(l.dx, l.batch*g.C*g.H*g.W)
	clear(l.dx)
	inv := 1 / float32(g.K*g.K)
	o := 0
	for p := range l.batch * g.C {
		plane := l.dx[p*g.H*g.W : (p+1)*g.H*g.W]
		for i := range oh {
			for j := range ow {
				d := dy[o] * inv
				o++
				a := i*g.Stride*g.W + j*g.Stride
				for ki := range g.K {
					row := plane[a+ki*g.W : a+ki*g.W+g.K]
					for t := range row {
						row[t] += d
					}
				}
			}
		}
	}
	return l.dx
}

// GlobalAvgPool averages each channel plane: x is (batch, C, HW) for any
// plane size HW = H·W, y is (batch, C). It is
// torch.nn.AdaptiveAvgPool2d(1) followed by a flatten.
type GlobalAvgPool struct {
	C int

	batch, hw int
	y, dx     []float32 // owned
}

// Forward returns the per-channel means.
func (l *GlobalAvgPool) Forward(x []float32, batch int, train bool) []float32 {
	if l.C < 1 || batch < 1 || len(x) == 0 || len(x)%(batch*l.C) != 0 {
		panic(fmt.Sprintf("models: GlobalAvgPool.Forward: len(x)=%d is not batch %d × C %d × H·W", len(x), batch, l.C))
	}
	l.batch, l.hw = batch, len(x)/(batch*l.C)
	l.y = grow(l.y, batch*l.C)
	inv := 1 / float32(l.hw)
	for p := range l.y {
		l.y[p] = sum32(x[p*l.hw:(p+1)*l.hw]) * inv
	}
	return l.y
}

// Backward spreads dy/(H·W) over each plane.
func (l *GlobalAvgPool) Backward(dy []float32) []float32 {
	if len(dy) != len(l.y) || l.batch == 0 {
		panic(fmt.Sprintf("models: GlobalAvgPool.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	l.dx = grow(l.dx, len(dy)*l.hw)
	inv := 1 / float32(l.hw)
	for p, d := range dy {
		fill(l.dx[p*l.hw:(p+1)*l.hw], d*inv)
	}
	return l.dx
}
