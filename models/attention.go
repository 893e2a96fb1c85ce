package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// SelfAttention is multi-head self-attention over (batch, Tokens, D)
// inputs, as torch.nn.MultiheadAttention(D, Heads, batch_first=True)
// called with query = key = value = x and no mask:
//
//	[q k v] = x·InWᵀ + InB              (InW is (3D, D), InB (3D))
//	o_h = softmax(q_h·k_hᵀ/√(D/Heads))·v_h   per head h
//	y = o·OutWᵀ + OutB                   (OutW is (D, D), OutB (D))
//
// The projections are Linear layers (In, Out) whose views the network
// binds under PyTorch's names in_proj_weight, in_proj_bias,
// out_proj.weight and out_proj.bias.
type SelfAttention struct {
	D, Heads, Tokens int
	In, Out          *Linear

	batch int
	qkv   []float32 // borrowed: In's output (batch·Tokens, 3D)
	probs []float32 // owned: attention weights (batch, Heads, Tokens, Tokens)
	o     []float32 // owned: concatenated head outputs (batch·Tokens, D)
	dqkv  []float32 // owned
	dp    []float32 // owned scratch (Tokens)
}

// NewSelfAttention returns a self-attention block; d must be a multiple
// of heads.
func NewSelfAttention(d, heads, tokens int) *SelfAttention {
	if d < 1 || heads < 1 || d%heads != 0 || tokens < 1 {
		panic(fmt.Sprintf("models: NewSelfAttention(%d, %d, %d): want D a positive multiple of heads", d, heads, tokens))
	}
	return &SelfAttention{D: d, Heads: heads, Tokens: tokens, In: NewLinear(d, 3*d), Out: NewLinear(d, d)}
}

// Init draws InW from xavier_uniform (bound √(6/(D+3D))), OutW from
// U(±1/√D), and zeroes both biases, as torch.nn.MultiheadAttention.
func (l *SelfAttention) Init(r *rand.Rand) {
	uniform(r, l.In.W, math.Sqrt(6/float64(4*l.D)))
	fill(l.In.B, 0)
	uniform(r, l.Out.W, 1/math.Sqrt(float64(l.D)))
	fill(l.Out.B, 0)
}

// Forward computes the attention output (batch, Tokens, D).
func (l *SelfAttention) Forward(x []float32, batch int, train bool) []float32 {
	d, t, h := l.D, l.Tokens, l.Heads
	if batch < 1 || len(x) != batch*t*d {
		panic(fmt.Sprintf("models: SelfAttention.Forward: len(x)=%d, want batch %d × %d tokens × %d", len(x), batch, t, d))
	}
	l.batch = batch
	l.qkv = l.In.Forward(x, batch*t, train)
	dh := d / h
	scale := float32(1 / math.Sqrt(float64(dh)))
	l.probs = grow(l.probs, batch*h*t*t)
	l.o = grow(l.o, batch*t*d)
	for n := range batch {
		qkv := l.qkv[n*t*3*d : (n+1)*t*3*d]
		for hd := range h {
			p := l.probs[(n*h+hd)*t*t : (n*h+hd+1)*t*t]
			for i := range t {
				q := qkv[i*3*d+hd*dh : i*3*d+hd*dh+dh]
				row := p[i*t : (i+1)*t]
				m := float32(math.Inf(-1))
				for j := range t {
					k := qkv[j*3*d+d+hd*dh : j*3*d+d+hd*dh+dh]
					row[j] = dot(q, k) * scale
					m = max(m, row[j])
				}
				var s float32
				for j, v := range row {
					e := float32(math.Exp(float64(v - m)))
					row[j] = e
					s += e
				}
				inv := 1 / s
				o := l.o[(n*t+i)*d+hd*dh : (n*t+i)*d+hd*dh+dh]
				clear(o)
				for j := range row {
					row[j] *= inv
					v := qkv[j*3*d+2*d+hd*dh : j*3*d+2*d+hd*dh+dh]
					axpy(o, row[j], v)
				}
			}
		}
	}
	return l.Out.Forward(l.o, batch*t, train)
}

// Backward back-propagates through the output projection, the attention
// weights and the input projection, and returns dx (batch, Tokens, D).
func (l *SelfAttention) Backward(dy []float32) []float32 {
	d, t, h := l.D, l.Tokens, l.Heads
	if l.batch == 0 || len(dy) != l.batch*t*d {
		panic(fmt.Sprintf("models: SelfAttention.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.batch*t*d))
	}
	do := l.Out.Backward(dy)
	dh := d / h
	scale := float32(1 / math.Sqrt(float64(dh)))
	l.dqkv = grow(l.dqkv, len(l.qkv))
	clear(l.dqkv)
	l.dp = grow(l.dp, t)
	for n := range l.batch {
		qkv := l.qkv[n*t*3*d : (n+1)*t*3*d]
		dqkv := l.dqkv[n*t*3*d : (n+1)*t*3*d]
		for hd := range h {
			p := l.probs[(n*h+hd)*t*t : (n*h+hd+1)*t*t]
			for i := range t {
				doi := do[(n*t+i)*d+hd*dh : (n*t+i)*d+hd*dh+dh]
				row := p[i*t : (i+1)*t]
				// dP[i,j] = dO_i·V_j; dV_j += P[i,j]·dO_i
				var s float32
				for j, pij := range row {
					v := qkv[j*3*d+2*d+hd*dh : j*3*d+2*d+hd*dh+dh]
					l.dp[j] = dot(doi, v)
					s += pij * l.dp[j]
					axpy(dqkv[j*3*d+2*d+hd*dh:j*3*d+2*d+hd*dh+dh], pij, doi)
				}
				// dS = P ⊙ (dP − Σ P·dP); dQ_i += scale·Σ_j dS_ij K_j; dK_j += scale·dS_ij Q_i
				q := qkv[i*3*d+hd*dh : i*3*d+hd*dh+dh]
				dq := dqkv[i*3*d+hd*dh : i*3*d+hd*dh+dh]
				for j, pij := range row {
					ds := pij * (l.dp[j] - s) * scale
					axpy(dq, ds, qkv[j*3*d+d+hd*dh:j*3*d+d+hd*dh+dh])
					axpy(dqkv[j*3*d+d+hd*dh:j*3*d+d+hd*dh+dh], ds, q)
				}
			}
		}
	}
	return l.In.Backward(l.dqkv)
}

// dot returns Σ a[i]·b[i] over len(a) (b at least as long).
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy sets y += alpha·x over len(y) (x at least as long).
func axpy(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// PatchEmbed turns (batch, C, H, W) images into (batch, 1+P, D) tokens for
// a vision transformer: the image is cut into P = ⌊H/Patch⌋·⌊W/Patch⌋
// non-overlapping Patch×Patch patches (row-major), each projected to D
// values — a Conv2d with stride equal to its kernel, computed as the
// Linear Proj (C·Patch·Patch → D) on flattened patches, whose weight has
// the Conv2d's (D, C, Patch, Patch) memory layout — and a learned class
// token Cls (D) is prepended; then the position embedding Pos (1+P, D) is
// added.
type PatchEmbed struct {
	C, H, W, Patch, D int
	Proj              *Linear
	// Views into the flat parameter buffer, and the matching gradients.
	Cls, Pos, DCls, DPos []float32

	batch   int
	patches []float32 // owned: (batch·P, C·Patch·Patch) rows
	y       []float32 // owned: (batch, 1+P, D)
	demb    []float32 // owned
}

// NewPatchEmbed returns a patch embedding; bind its views before use.
func NewPatchEmbed(c, h, w, patch, d int) *PatchEmbed {
	if c < 1 || patch < 1 || h < patch || w < patch || d < 1 {
		panic(fmt.Sprintf("models: NewPatchEmbed(%d, %d, %d, %d, %d): invalid geometry", c, h, w, patch, d))
	}
	return &PatchEmbed{C: c, H: h, W: w, Patch: patch, D: d, Proj: NewLinear(c*patch*patch, d)}
}

// NumPatches is P = ⌊H/Patch⌋·⌊W/Patch⌋; there are 1+P tokens.
func (l *PatchEmbed) NumPatches() int { return (l.H / l.Patch) * (l.W / l.Patch) }

// Init draws the projection as nn.Conv2d's default (U(±1/√fan_in)) and the
// class token and position embedding from N(0, 0.02²) truncated to ±2σ.
func (l *PatchEmbed) Init(r *rand.Rand) {
	bound := 1 / math.Sqrt(float64(l.C*l.Patch*l.Patch))
	uniform(r, l.Proj.W, bound)
	uniform(r, l.Proj.B, bound)
	truncNormal(r, l.Cls, 0.02)
	truncNormal(r, l.Pos, 0.02)
}

// Forward returns the tokens (batch, 1+P, D).
func (l *PatchEmbed) Forward(x []float32, batch int, train bool) []float32 {
	in := l.C * l.H * l.W
	if batch < 1 || len(x) != batch*in {
		panic(fmt.Sprintf("models: PatchEmbed.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, l.C, l.H, l.W))
	}
	if len(l.Cls) != l.D || len(l.DCls) != l.D || len(l.Pos) != (1+l.NumPatches())*l.D || len(l.DPos) != len(l.Pos) {
		panic("models: PatchEmbed: views not bound")
	}
	l.batch = batch
	ps, d, np := l.Patch, l.D, l.NumPatches()
	k := l.C * ps * ps
	pw := l.W / ps
	l.patches = grow(l.patches, batch*np*k)
	o := 0
	for n := range batch {
		xn := x[n*in : (n+1)*in]
		for p := range np {
			pi, pj := p/pw, p%pw
			for c := range l.C {
				for ki := range ps {
					off := (c*l.H+pi*ps+ki)*l.W + pj*ps
					copy(l.patches[o:o+ps], xn[off:off+ps])
					o += ps
				}
			}
		}
	}
	emb := l.Proj.Forward(l.patches, batch*np, train) // (batch·P, D)
	l.y = grow(l.y, batch*(1+np)*d)
	for n := range batch {
		y := l.y[n*(1+np)*d : (n+1)*(1+np)*d]
		for i := range d {
			y[i] = l.Cls[i] + l.Pos[i]
		}
		e := emb[n*np*d : (n+1)*np*d]
		for i, v := range e {
			y[d+i] = v + l.Pos[d+i]
		}
	}
	return l.y
}

// Backward accumulates the gradients of the projection, class token and
// position embedding. It returns nil: the images need no gradient.
func (l *PatchEmbed) Backward(dy []float32) []float32 {
	d, np := l.D, l.NumPatches()
	if l.batch == 0 || len(dy) != l.batch*(1+np)*d {
		panic(fmt.Sprintf("models: PatchEmbed.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.batch*(1+np)*d))
	}
	l.demb = grow(l.demb, l.batch*np*d)
	for n := range l.batch {
		dyn := dy[n*(1+np)*d : (n+1)*(1+np)*d]
		for i, v := range dyn {
			l.DPos[i] += v
		}
		for i, v := range dyn[:d] {
			l.DCls[i] += v
		}
		copy(l.demb[n*np*d:(n+1)*np*d], dyn[d:])
	}
	l.Proj.SkipInputGrad = true
	l.Proj.Backward(l.demb)
	return nil
}

// ClassToken selects the first token of each sample: x is (batch, Tokens,
// D) and y is (batch, D).
type ClassToken struct {
	Tokens, D int

	batch int
	y, dx []float32 // owned
}

// Forward copies token 0 of each sample.
func (l *ClassToken) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x) != batch*l.Tokens*l.D {
		panic(fmt.Sprintf("models: ClassToken.Forward: len(x)=%d, want batch %d × %d tokens × %d", len(x), batch, l.Tokens, l.D))
	}
	l.batch = batch
	l.y = grow(l.y, batch*l.D)
	for n := range batch {
		copy(l.y[n*l.D:(n+1)*l.D], x[n*l.Tokens*l.D:])
	}
	return l.y
}

// Backward returns dy in token 0 and zeros elsewhere.
func (l *ClassToken) Backward(dy []float32) []float32 {
	if l.batch == 0 || len(dy) != l.batch*l.D {
		panic(fmt.Sprintf("models: ClassToken.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.batch*l.D))
	}
	l.dx = grow(l.dx, l.batch*l.Tokens*l.D)
	clear(l.dx)
	for n := range l.batch {
		copy(l.dx[n*l.Tokens*l.D:], dy[n*l.D:(n+1)*l.D])
	}
	return l.dx
}
