package models

import (
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/gradsync/gradsync/internal/kernels"
)

// The CIFAR-style architectures: resnet18, se-resnet8 and mobilenet
// (convvit is in convvit.go). Each is built for any C×H×W and class
// count; their parameter names are those of the PyTorch modules in
// scripts/torch_fixtures.py.

func init() {
	archs["resnet18"] = resnet18
	archs["se-resnet8"] = seResnet8
	archs["mobilenet"] = mobileNet(1)
	archs["mobilenet-0.5"] = mobileNet(0.5)
}

// resnet18 is torchvision's resnet18 in its CIFAR form (He et al. 2016's
// ResNet-18 as adapted for 32×32 inputs, e.g. kuangliu/pytorch-cifar): a
// 3×3 stride-1 stem conv1 C→64 with bn1 and ReLU and no max pool, then
// four stages of two BasicBlocks, 64, 128, 256 and 512 channels, the
// last three starting with stride 2 (32×32 becomes 32, 16, 8, 4), a
// global average pool and fc 512→classes. Names are torchvision's:
// conv1, bn1, layer1.0.conv1 … layer4.1.bn2, layerK.0.downsample.{0,1},
// fc (11,173,962 parameters with 3 channels and 10 classes).
func resnet18(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	return b.resnet(opt, []int{64, 128, 256, 512}, []int{2, 2, 2, 2}, 0), b.initAll
}

// seReduction is SE-ResNet8's squeeze ratio: the excitation's hidden
// layer has C/4 units (4, 8, 16), the ratio small networks use
// (MobileNetV3's), since the paper's 16 would leave one unit of 16.
const seReduction = 4

// seResnet8 is resnet8 with squeeze-and-excitation (Hu et al. 2018) in
// every BasicBlock: after bn2 the block's output is scaled per channel
// by σ(fc2(ReLU(fc1(mean_hw)))) before the shortcut is added. The SE
// modules are named layerK.0.se.fc1 and .fc2, torchvision.ops.
// SqueezeExcitation's names and 1×1-convolution layout.
func seResnet8(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
	return b.resnet(opt, []int{16, 32, 64}, []int{1, 1, 1}, seReduction), b.initAll
}

// squeezeExcite declares a SqueezeExcite over c channels as
// prefix.fc1.{weight,bias} (hidden, c, 1, 1) and prefix.fc2.{weight,bias}
// (c, hidden, 1, 1), and queues its initialisation.
func (b *builder) squeezeExcite(prefix string, c, hidden int) *SqueezeExcite {
	l := NewSqueezeExcite(c, hidden)
	b.param(prefix+".fc1.weight", &l.FC1.W, &l.FC1.DW, hidden, c, 1, 1)
	b.param(prefix+".fc1.bias", &l.FC1.B, &l.FC1.DB, hidden)
	b.param(prefix+".fc2.weight", &l.FC2.W, &l.FC2.DW, c, hidden, 1, 1)
	b.param(prefix+".fc2.bias", &l.FC2.B, &l.FC2.DB, c)
	b.onInit(l.Init)
	return l
}

// depthwise declares a DepthwiseConv2D's prefix.weight (C, 1, KH, KW)
// and, with bias, prefix.bias (C), and queues its initialisation.
func (b *builder) depthwise(prefix string, g kernels.ConvGeom, bias bool) *DepthwiseConv2D {
	b.fits(prefix, g)
	l := NewDepthwiseConv2D(g, bias)
	b.param(prefix+".weight", &l.W, &l.DW, g.C, 1, g.KH, g.KW)
	if bias {
		b.param(prefix+".bias", &l.B, &l.DB, g.C)
	}
	b.onInit(l.Init)
	return l
}

// mobileNetBlocks are MobileNetV1's 13 depthwise-separable blocks: output
// channels and the depthwise stride (Howard et al. 2017, Table 1; in the
// CIFAR form only the stem's stride 2 becomes 1).
var mobileNetBlocks = []struct{ out, stride int }{
	{64, 1}, {128, 2}, {128, 1}, {256, 2}, {256, 1}, {512, 2},
	{512, 1}, {512, 1}, {512, 1}, {512, 1}, {512, 1}, {1024, 2}, {1024, 1},
}

// mobileNet returns MobileNetV1 (Howard et al. 2017) with width
// multiplier alpha (every layer's channels ×alpha, rounded, at least 1)
// in its CIFAR form, laid out and named as kuangliu/pytorch-cifar's
// MobileNet:
//
//	conv1 3×3 C→32α stride 1 (no bias), bn1, ReLU,
//	layers.i for i < 13: conv1 a 3×3 depthwise convolution (stride 1 or
//	  2, padding 1, no bias), bn1, ReLU, conv2 a 1×1 convolution to the
//	  block's channels (no bias), bn2, ReLU,
//	global average pool, linear 1024α→classes.
//
// 32×32 inputs become 32, 16, 8, 4, 2 (3,217,226 parameters with 3
// channels, 10 classes and α = 1). Every convolution is padded so that
// any input size works.
func mobileNet(alpha float64) arch {
	width := func(c int) int { return max(1, int(math.Round(float64(c)*alpha))) }
	return func(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
		b.chain = chainConvs
		c := width(32)
		stem := b.conv("conv1", geom(opt.Channels, opt.Height, opt.Width, 3, 1, 1), c, false)
		stem.SkipInputGrad = true
		bn, relu := b.bnReLU("bn1", c)
		layers := []Layer{stem, bn, relu}
		h, w := stem.Geom.OutH(), stem.Geom.OutW()
		for i, blk := range mobileNetBlocks {
			prefix := "layers." + strconv.Itoa(i)
			out := width(blk.out)
			dw := b.depthwise(prefix+".conv1", geom(c, h, w, 3, blk.stride, 1), false)
			bn1, relu1 := b.bnReLU(prefix+".bn1", c)
			h, w = dw.Geom.OutH(), dw.Geom.OutW()
			pw := b.conv(prefix+".conv2", geom(c, h, w, 1, 1, 0), out, false)
			bn2, relu2 := b.bnReLU(prefix+".bn2", out)
			layers = append(layers, dw, bn1, relu1, pw, bn2, relu2)
			c = out
		}
		layers = append(layers, &GlobalAvgPool{C: c}, b.fc("linear", c, opt.Classes))
		return layers, b.initAll
	}
}
