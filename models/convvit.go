package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

func init() { archs["convvit"] = convViT }

// MapTokens turns a (batch, D, HW) feature map into (batch, HW, D)
// tokens — one per position, its D channels as the token's values, as
// PyTorch's x.flatten(2).transpose(1, 2) — and adds the learned position
// embedding Pos (HW, D).
type MapTokens struct {
	D, Tokens int
	// Pos and DPos are views into the flat parameter and gradient buffers.
	Pos, DPos []float32

	batch int
	y, dx []float32 // owned
}

// Init draws the position embedding from N(0, 0.02²) truncated to ±2σ,
// timm's (and vit-tiny's) initialisation.
func (l *MapTokens) Init(r *rand.Rand) { truncNormal(r, l.Pos, 0.02) }

// truncNormal fills dst from N(0, std²), redrawing values beyond ±2σ.
func truncNormal(r *rand.Rand, dst []float32, std float64) {
	for i := range dst {
		z := r.NormFloat64()
		for math.Abs(z) > 2 {
			z = r.NormFloat64()
		}
		dst[i] = float32(std * z)
	}
}

// Forward returns the tokens (batch, Tokens, D).
func (l *MapTokens) Forward(x []float32, batch int, train bool) []float32 {
	d, t := l.D, l.Tokens
	if batch < 1 || len(x) != batch*d*t {
		panic(fmt.Sprintf("models: MapTokens.Forward: len(x)=%d, want batch %d × %d channels × %d positions", len(x), batch, d, t))
	}
	if len(l.Pos) != t*d || len(l.DPos) != t*d {
		panic("models: MapTokens: views not bound")
	}
	l.batch = batch
	l.y = grow(l.y, len(x))
	for n := range batch {
		xn, yn := x[n*d*t:(n+1)*d*t], l.y[n*d*t:(n+1)*d*t]
		for p := range t {
			row, pos := yn[p*d:(p+1)*d], l.Pos[p*d:(p+1)*d]
			for c := range row {
				row[c] = xn[c*t+p] + pos[c]
			}
		}
	}
	return l.y
}

// Backward adds the position embedding's gradient and returns dy back in
// the feature map's layout.
func (l *MapTokens) Backward(dy []float32) []float32 {
	d, t := l.D, l.Tokens
	if l.batch == 0 || len(dy) != l.batch*d*t {
		panic(fmt.Sprintf("models: MapTokens.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.batch*d*t))
	}
	l.dx = grow(l.dx, len(dy))
	for n := range l.batch {
		dyn, dxn := dy[n*d*t:(n+1)*d*t], l.dx[n*d*t:(n+1)*d*t]
		for i, v := range dyn {
			l.DPos[i] += v
		}
		for p := range t {
			row := dyn[p*d : (p+1)*d]
			for c, v := range row {
				dxn[c*t+p] = v
			}
		}
	}
	return l.dx
}

// MeanTokens averages each sample's tokens: x is (batch, Tokens, D) and
// y is (batch, D) (PyTorch's x.mean(dim=1), ViT's "avg" pooling).
type MeanTokens struct {
	Tokens, D int

	batch int
	y, dx []float32 // owned
}

// Forward returns the mean token of each sample.
func (l *MeanTokens) Forward(x []float32, batch int, train bool) []float32 {
	d, t := l.D, l.Tokens
	if batch < 1 || len(x) != batch*t*d {
		panic(fmt.Sprintf("models: MeanTokens.Forward: len(x)=%d, want batch %d × %d tokens × %d", len(x), batch, t, d))
	}
	l.batch = batch
	l.y = grow(l.y, batch*d)
	inv := 1 / float32(t)
	for n := range batch {
		y := l.y[n*d : (n+1)*d]
		clear(y)
		for p := range t {
			addTo(y, x[(n*t+p)*d:(n*t+p+1)*d])
		}
		for c := range y {
			y[c] *= inv
		}
	}
	return l.y
}

// Backward spreads dy/Tokens over every token.
func (l *MeanTokens) Backward(dy []float32) []float32 {
	d, t := l.D, l.Tokens
	if l.batch == 0 || len(dy) != l.batch*d {
		panic(fmt.Sprintf("models: MeanTokens.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.batch*d))
	}
	l.dx = grow(l.dx, l.batch*t*d)
	inv := 1 / float32(t)
	for n := range l.batch {
		for p := range t {
			row := l.dx[(n*t+p)*d : (n*t+p+1)*d]
			for c, v := range dy[n*d : (n+1)*d] {
				row[c] = v * inv
			}
		}
	}
	return l.dx
}

// addTo sets dst[i] += src[i] for i < len(dst).
func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += v
	}
}

// convViTStem are the stem's output channels: two 3×3 stride-2
// convolutions, the second giving the tokens' vitDim values.
var convViTStem = []int{32, vitDim}

// convViT is a hybrid CNN + Transformer (the convolutional-stem ViTs of
// Xiao et al. 2021, "Early Convolutions Help Transformers See Better"):
// a stem of two 3×3 stride-2 convolutions with batch norm and ReLU,
//
//	stem.0 Conv2d(C, 32, 3, 2, 1, bias=False), stem.1 BatchNorm2d, stem.2 ReLU,
//	stem.3 Conv2d(32, 64, 3, 2, 1, bias=False), stem.4 BatchNorm2d, stem.5 ReLU,
//
// whose H/4×W/4 positions become 64-value tokens (32×32: 8×8 = 64 tokens)
// plus a learned pos_embed (1, tokens, 64); then vit-tiny's two
// transformer blocks (blocks.i, 4 heads, GELU MLP of 128), a final
// LayerNorm (norm) on every token, the mean over tokens, and head.
// Every convolution is padded, so any input size works.
func convViT(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	var layers []Layer
	b.chain = chainConvs
	c, h, w := opt.Channels, opt.Height, opt.Width
	for i, out := range convViTStem {
		conv := b.conv("stem."+fmt.Sprint(3*i), geom(c, h, w, 3, 2, 1), out, false)
		conv.SkipInputGrad = i == 0
		bn, relu := b.bnReLU("stem."+fmt.Sprint(3*i+1), out)
		layers = append(layers, conv, bn, relu)
		c, h, w = out, conv.Geom.OutH(), conv.Geom.OutW()
	}
	t := h * w
	tok := &MapTokens{D: vitDim, Tokens: t}
	b.param("pos_embed", &tok.Pos, &tok.DPos, 1, t, vitDim)
	b.onInit(tok.Init)
	layers = append(layers, tok)
	layers = append(layers, b.transformerBlocks(t)...)
	layers = append(layers, b.layerNorm("norm", vitDim), &MeanTokens{Tokens: t, D: vitDim}, b.fc("head", vitDim, opt.Classes))
	return layers, b.initAll
}
