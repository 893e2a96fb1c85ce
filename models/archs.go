package models

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/gradsync/gradsync/internal/kernels"
)

func init() {
	archs["lenet5"] = lenet5
	archs["cnn"] = kerasCNN
	archs["fedcnn"] = fedCNN
	archs["resnet8"] = resnet8
	archs["vit-tiny"] = vitTiny
}

// conv declares a Conv2D's prefix.weight (Out, C, KH, KW) and, with bias,
// prefix.bias (Out), and queues its default initialisation.
func (b *builder) conv(prefix string, g kernels.ConvGeom, out int, bias bool) *Conv2D {
	b.fits(prefix, g)
	l := NewConv2D(g, out, bias)
	l.Chain = b.chain
	b.param(prefix+".weight", &l.W, &l.DW, out, g.C, g.KH, g.KW)
	if bias {
		b.param(prefix+".bias", &l.B, &l.DB, out)
	}
	b.onInit(l.Init)
	return l
}

// chainConvs makes the batch-norm architectures (resnet8, resnet18,
// se-resnet8, mobilenet, convvit) run their convolutions' forward and
// input-gradient products on kernels.GemmChain, where the CPU has its
// kernel; the others keep Gemm, so their results do not move. A variable
// so that tests can compare the two.
var chainConvs = kernels.ChainOK()

// fuseReLU makes the builders fuse each ReLU that follows a batch norm
// into it (bnReLU); a variable so that tests can compare with the
// unfused layers. (The ReLU after a residual sum is not fused: with
// activation checkpointing, a block whose output gradient passes
// through a fused ReLU takes its backward arena out of turn, and
// resnet8's blocks checkpointing then held 1.7× less memory instead of
// 2.0× for a saving of one pass over the block's output.)
var fuseReLU = true

// bnReLU declares a batch norm as batchNorm does and returns it with the
// ReLU that follows it, fused into it when fuseReLU is set.
func (b *builder) bnReLU(prefix string, c int) (*BatchNorm2d, *ReLU) {
	l := b.batchNorm(prefix, c)
	l.ReLU = fuseReLU
	return l, &ReLU{Fused: fuseReLU}
}

// fc declares a Linear as linear does and queues its initialisation.
func (b *builder) fc(prefix string, in, out int) *Linear {
	l := b.linear(prefix, in, out)
	b.onInit(l.Init)
	return l
}

// batchNorm declares prefix.weight, prefix.bias and the buffers
// prefix.running_mean, prefix.running_var.
func (b *builder) batchNorm(prefix string, c int) *BatchNorm2d {
	l := NewBatchNorm2d(c)
	b.bns = append(b.bns, l)
	b.param(prefix+".weight", &l.Weight, &l.DWeight, c)
	b.param(prefix+".bias", &l.Bias, &l.DBias, c)
	b.buffer(prefix+".running_mean", &l.RunningMean, c)
	b.buffer(prefix+".running_var", &l.RunningVar, c)
	b.onInit(func(*rand.Rand) { l.Init() })
	return l
}

// layerNorm declares prefix.weight and prefix.bias.
func (b *builder) layerNorm(prefix string, d int) *LayerNorm {
	l := NewLayerNorm(d)
	b.param(prefix+".weight", &l.Weight, &l.DWeight, d)
	b.param(prefix+".bias", &l.Bias, &l.DBias, d)
	b.onInit(func(*rand.Rand) { l.Init() })
	return l
}

// dropout returns a Dropout whose mask stream is derived from the network
// seed and the layer's position among the network's dropouts.
func (b *builder) dropout(p float32) *Dropout {
	seed := b.seed*0x9e3779b97f4a7c15 + uint64(len(b.dropouts)+1)*0xbf58476d1ce4e5b9
	l := NewDropout(p, seed)
	b.dropouts = append(b.dropouts, l)
	return l
}

// geom is the geometry of a k×k convolution over (c, h, w) with equal
// strides and paddings on both axes.
func geom(c, h, w, k, stride, pad int) kernels.ConvGeom {
	return kernels.ConvGeom{C: c, H: h, W: w, KH: k, KW: k, StrideH: stride, StrideW: stride, PadH: pad, PadW: pad}
}

// lenet5 is common.py's "lenet" exactly, with its nn.Sequential indices as
// parameter names:
//
//	0 Conv2d(C, 6, 5, padding=2), 1 ReLU, 2 MaxPool2d(2),
//	3 Conv2d(6, 16, 5), 4 ReLU, 5 MaxPool2d(2), 6 Flatten,
//	7 Linear(16·5·5, 120), 8 ReLU, 9 Linear(120, 84), 10 ReLU, 11 Linear(84, classes)
//
// (61,706 parameters on 1×28×28 with 10 classes). Each ReLU before a
// pool is fused into the pool (relu∘maxpool = maxpool∘relu).
func lenet5(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	c1 := b.conv("0", geom(opt.Channels, opt.Height, opt.Width, 5, 1, 2), 6, true)
	c1.SkipInputGrad = true
	g1 := c1.Geom
	p1 := b.maxPool("2", PoolGeom{C: 6, H: g1.OutH(), W: g1.OutW(), K: 2, Stride: 2})
	c2 := b.conv("3", geom(6, p1.Geom.OutH(), p1.Geom.OutW(), 5, 1, 0), 16, true)
	p2 := b.maxPool("5", PoolGeom{C: 16, H: c2.Geom.OutH(), W: c2.Geom.OutW(), K: 2, Stride: 2})
	p1.ReLU, p2.ReLU = true, true
	f1 := b.fc("7", p2.Geom.OutSize(), 120)
	f2 := b.fc("9", 120, 84)
	f3 := b.fc("11", 84, opt.Classes)
	return []Layer{c1, p1, c2, p2, &Flatten{}, f1, &ReLU{}, f2, &ReLU{}, f3}, b.initAll
}

// kerasCNN is the Keras MNIST example net (common.py's "kerascnn" with the
// Keras dropouts restored), named by its nn.Sequential indices:
//
//	0 Conv2d(C, 32, 3), 1 ReLU, 2 Conv2d(32, 64, 3), 3 ReLU, 4 MaxPool2d(2),
//	5 Dropout(0.25), 6 Flatten, 7 Linear(64·12·12, 128), 8 ReLU,
//	9 Dropout(0.5), 10 Linear(128, classes)
//
// (1,199,882 parameters on 1×28×28 with 10 classes). The first ReLU is
// fused into its convolution, the second into the pool, and the pool into
// the second convolution's Winograd output transform (ConvMaxPool).
func kerasCNN(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	c1 := b.conv("0", geom(opt.Channels, opt.Height, opt.Width, 3, 1, 0), 32, true)
	c1.SkipInputGrad = true
	c2 := b.conv("2", geom(32, c1.Geom.OutH(), c1.Geom.OutW(), 3, 1, 0), 64, true)
	p := b.maxPool("4", PoolGeom{C: 64, H: c2.Geom.OutH(), W: c2.Geom.OutW(), K: 2, Stride: 2})
	c1.ReLU, p.ReLU = true, true
	d1 := b.dropout(0.25)
	f1 := b.fc("7", p.Geom.OutSize(), 128)
	d2 := b.dropout(0.5)
	f2 := b.fc("10", 128, opt.Classes)
	return []Layer{c1, NewConvMaxPool(c2, p), d1, &Flatten{}, f1, &ReLU{}, d2, f2}, b.initAll
}

// fedCNN is the MNIST CNN of McMahan et al. 2017 ("Communication-Efficient
// Learning of Deep Networks from Decentralized Data", section 3): two 5×5
// convolutions with 32 and 64 channels, each followed by ReLU and 2×2 max
// pooling, a fully connected layer of 512 units with ReLU and a softmax
// output. With "same" padding it has the paper's 1,663,370 parameters on
// 1×28×28 with 10 classes. Named by nn.Sequential indices:
//
//	0 Conv2d(C, 32, 5, padding=2), 1 ReLU, 2 MaxPool2d(2),
//	3 Conv2d(32, 64, 5, padding=2), 4 ReLU, 5 MaxPool2d(2), 6 Flatten,
//	7 Linear(64·7·7, 512), 8 ReLU, 9 Linear(512, classes)
//
// Each ReLU before a pool is fused into the pool.
func fedCNN(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	c1 := b.conv("0", geom(opt.Channels, opt.Height, opt.Width, 5, 1, 2), 32, true)
	c1.SkipInputGrad = true
	p1 := b.maxPool("2", PoolGeom{C: 32, H: c1.Geom.OutH(), W: c1.Geom.OutW(), K: 2, Stride: 2})
	c2 := b.conv("3", geom(32, p1.Geom.OutH(), p1.Geom.OutW(), 5, 1, 2), 64, true)
	p2 := b.maxPool("5", PoolGeom{C: 64, H: c2.Geom.OutH(), W: c2.Geom.OutW(), K: 2, Stride: 2})
	p1.ReLU, p2.ReLU = true, true
	f1 := b.fc("7", p2.Geom.OutSize(), 512)
	f2 := b.fc("9", 512, opt.Classes)
	return []Layer{c1, p1, c2, p2, &Flatten{}, f1, &ReLU{}, f2}, b.initAll
}

// resnet8 is a small residual network, laid out and named as
// torchvision's ResNet with one BasicBlock per stage:
//
//	conv1 3×3 C→16 (no bias), bn1, ReLU,
//	layer1.0: BasicBlock 16→16 stride 1,
//	layer2.0: BasicBlock 16→32 stride 2 (downsample.0 1×1 conv, downsample.1 bn),
//	layer3.0: BasicBlock 32→64 stride 2 (likewise),
//	global average pool, fc 64→classes.
//
// A BasicBlock is ReLU(bn2(conv2(ReLU(bn1(conv1(x))))) + shortcut(x)), its
// convolutions 3×3 with padding 1 and no bias. 28×28 becomes 28, 14, 7
// (32×32: 32, 16, 8); every padded 3×3 convolution takes inputs down to
// 1×1, so any C×H×W does.
func resnet8(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	return b.resnet(opt, []int{16, 32, 64}, []int{1, 1, 1}, 0), b.initAll
}

// resnet declares a torchvision ResNet of BasicBlocks in its CIFAR form:
// a 3×3 stride-1 stem conv1 (no bias) to widths[0], bn1 and ReLU (no max
// pool), then stage i (layer1, layer2, …) of depths[i] BasicBlocks of
// widths[i] channels, the first of each stage after the first with
// stride 2, then a global average pool and fc. se > 0 puts
// squeeze-and-excitation with hidden width C/se in every block.
func (b *builder) resnet(opt Options, widths, depths []int, se int) []Layer {
	b.chain = chainConvs
	stem := b.conv("conv1", geom(opt.Channels, opt.Height, opt.Width, 3, 1, 1), widths[0], false)
	stem.SkipInputGrad = true
	bn1, relu := b.bnReLU("bn1", widths[0])
	layers := []Layer{stem, bn1, relu}
	c, h, w := widths[0], stem.Geom.OutH(), stem.Geom.OutW()
	for i, out := range widths {
		for j := range depths[i] {
			stride := 1
			if i > 0 && j == 0 {
				stride = 2
			}
			prefix := "layer" + strconv.Itoa(i+1) + "." + strconv.Itoa(j)
			block, oh, ow := b.basicBlock(prefix, c, h, w, out, stride, se)
			layers = append(layers, block, &ReLU{})
			c, h, w = out, oh, ow
		}
	}
	return append(layers, &GlobalAvgPool{C: c}, b.fc("fc", c, opt.Classes))
}

// basicBlock declares a torchvision BasicBlock (without its final ReLU)
// over (in, h, w) inputs and returns it with its output size. se > 0
// adds squeeze-and-excitation (prefix.se, hidden width out/se) after bn2,
// before the shortcut is added, as in SE-ResNet.
func (b *builder) basicBlock(prefix string, in, h, w, out, stride, se int) (*Residual, int, int) {
	c1 := b.conv(prefix+".conv1", geom(in, h, w, 3, stride, 1), out, false)
	bn1, relu := b.bnReLU(prefix+".bn1", out)
	oh, ow := c1.Geom.OutH(), c1.Geom.OutW()
	c2 := b.conv(prefix+".conv2", geom(out, oh, ow, 3, 1, 1), out, false)
	bn2 := b.batchNorm(prefix+".bn2", out)
	r := &Residual{Body: []Layer{c1, bn1, relu, c2, bn2}}
	if se > 0 {
		r.Body = append(r.Body, b.squeezeExcite(prefix+".se", out, max(1, out/se)))
	}
	if stride != 1 || in != out {
		ds := b.conv(prefix+".downsample.0", geom(in, h, w, 1, stride, 0), out, false)
		r.Shortcut = []Layer{ds, b.batchNorm(prefix+".downsample.1", out)}
	}
	return r, oh, ow
}

// ViT-tiny hyper-parameters.
const (
	vitPatch = 7
	vitDim   = 64
	vitHeads = 4
	vitDepth = 2
	vitMLP   = 128
)

// TransformerSizes are a transformer's sizes: D values per token, Heads
// attention heads, an MLP of MLP hidden units, Depth blocks, Patch×Patch
// patches.
type TransformerSizes struct{ D, Heads, MLP, Depth, Patch int }

// ViTTiny returns vit-tiny's sizes (for the jobs that split its blocks:
// tensor parallelism).
func ViTTiny() TransformerSizes {
	return TransformerSizes{D: vitDim, Heads: vitHeads, MLP: vitMLP, Depth: vitDepth, Patch: vitPatch}
}

// vitTiny is a small pre-norm vision transformer: 7×7 patches embedded to
// 64 values plus a class token and learned position embeddings, two
// blocks of x += attn(norm1(x)); x += mlp(norm2(x)) with 4 heads and a
// GELU MLP of width 128, a final LayerNorm on the class token and a
// linear head. Parameter names follow scripts/torch_fixtures.py's ViT:
//
//	patch_embed.proj.{weight,bias}, cls_token (1,1,D), pos_embed (1,1+P,D),
//	blocks.i.norm1, blocks.i.attn.{in_proj_weight,in_proj_bias,out_proj.weight,out_proj.bias},
//	blocks.i.norm2, blocks.i.mlp.fc1, blocks.i.mlp.fc2, norm, head.
func vitTiny(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	d := vitDim
	if opt.Height < vitPatch || opt.Width < vitPatch {
		b.tooSmall(fmt.Sprintf("its %d×%d patches do not fit in %d×%d images", vitPatch, vitPatch, opt.Height, opt.Width))
	}
	pe := NewPatchEmbed(opt.Channels, opt.Height, opt.Width, vitPatch, d)
	t := 1 + pe.NumPatches()
	b.param("patch_embed.proj.weight", &pe.Proj.W, &pe.Proj.DW, d, opt.Channels, vitPatch, vitPatch)
	b.param("patch_embed.proj.bias", &pe.Proj.B, &pe.Proj.DB, d)
	b.param("cls_token", &pe.Cls, &pe.DCls, 1, 1, d)
	b.param("pos_embed", &pe.Pos, &pe.DPos, 1, t, d)
	b.onInit(pe.Init)
	layers := append([]Layer{pe}, b.transformerBlocks(t)...)
	layers = append(layers, &ClassToken{Tokens: t, D: d}, b.layerNorm("norm", d), b.fc("head", d, opt.Classes))
	return layers, b.initAll
}

// transformerBlocks declares vit-tiny's vitDepth pre-norm blocks
// (blocks.i.norm1, .attn, .norm2, .mlp.fc1, .mlp.fc2) over t tokens of
// vitDim values: x += attn(norm1(x)); x += mlp(norm2(x)).
func (b *builder) transformerBlocks(t int) []Layer {
	d := vitDim
	var layers []Layer
	for i := range vitDepth {
		prefix := "blocks." + strconv.Itoa(i)
		n1 := b.layerNorm(prefix+".norm1", d)
		at := NewSelfAttention(d, vitHeads, t)
		b.param(prefix+".attn.in_proj_weight", &at.In.W, &at.In.DW, 3*d, d)
		b.param(prefix+".attn.in_proj_bias", &at.In.B, &at.In.DB, 3*d)
		b.param(prefix+".attn.out_proj.weight", &at.Out.W, &at.Out.DW, d, d)
		b.param(prefix+".attn.out_proj.bias", &at.Out.B, &at.Out.DB, d)
		b.onInit(at.Init)
		n2 := b.layerNorm(prefix+".norm2", d)
		fc1 := b.fc(prefix+".mlp.fc1", d, vitMLP)
		fc2 := b.fc(prefix+".mlp.fc2", vitMLP, d)
		layers = append(layers,
			&Residual{Body: []Layer{n1, at}},
			&Residual{Body: []Layer{n2, &Tokenwise{fc1, t}, &GELU{}, &Tokenwise{fc2, t}}})
	}
	return layers
}
