// Package models holds the neural-network layers, losses and named
// architectures that gradsync trains.
//
// A Network keeps all its parameters in one flat []float32 and all its
// gradients in another of the same length and layout; each layer sees
// views (sub-slices) of them. Segments name each view with its PyTorch
// parameter name and layout (fc.weight is [out,in], conv weights are
// [out,in,kh,kw]), so reducers, optimisers, compressors and checkpoints
// work on the flat buffers while weights still move to and from PyTorch.
// Non-trainable state (batch norm's running_mean and running_var) lives
// in a third flat buffer, Buffers, named by BufferSegments; it has no
// gradient. State and LoadState convert both to and from a PyTorch
// state_dict, which ReadSafetensors and WriteSafetensors store.
//
// Architectures (New, Names): logreg, mlp, lenet5 and cnn (named by the
// nn.Sequential indices of anchors/pytorch/common.py's models), fedcnn
// (McMahan et al. 2017's MNIST CNN, named likewise), resnet8 and vit-tiny
// (torchvision- and timm-style names), and for colour images resnet18 (the
// CIFAR form of torchvision's), se-resnet8 (squeeze-and-excitation),
// mobilenet and mobilenet-0.5 (MobileNetV1, width multiplier 1 and 0.5, as
// kuangliu/pytorch-cifar's) and convvit (a convolutional stem feeding
// vit-tiny's transformer blocks). Each is built for any Options shape; an
// input too small for its kernels, pools or patches is an error from New
// naming the layer and the smallest input (shape.go). scripts/
// torch_fixtures.py builds the same networks in PyTorch, and
// parity_test.go checks logits and gradients against them.
//
// Layers have explicit Forward and Backward passes over row-major float32
// batches: Linear, Conv2D (im2col + GEMM, or Winograd F(2×2,3×3) for 3×3
// stride-1 kernels over at least 4 channels), DepthwiseConv2D (a direct
// per-channel loop), MaxPool2D, AvgPool2D, GlobalAvgPool, ReLU, GELU,
// Sigmoid, Dropout, BatchNorm2d, LayerNorm, Residual, SqueezeExcite,
// SelfAttention, PatchEmbed, ClassToken, MapTokens, MeanTokens, Flatten. Forward's train flag
// switches dropout and batch norm between training and evaluation
// behaviour. Activation and gradient buffers are owned by the layers and
// reused from step to step: once warmed up for a batch size, Forward and
// Backward do not allocate. Shape bugs panic with a "models: " prefix.
//
// SetCheckpointing trades compute for memory (activation checkpointing,
// checkpoint.go): a training Forward keeps only the inputs of segments
// of blocks, and Backward recomputes each segment before going through
// it, replaying its dropout masks and leaving batch norm's running
// statistics as one Forward moves them, so the gradients are
// bit-identical; the segments' buffers are lent from shared arenas, and
// ActivationBytes accounts the activation memory held. SetPrecision
// selects bf16 or fp16 operands, with float32 accumulation, for the
// matrix products of linear layers and convolutions (precision.go,
// torch.autocast's semantics); fp32, the default, is unchanged bit for bit.
//
// Where it is exact, an activation is fused into its neighbour for speed:
// a ReLU before a max pool runs inside the pool (relu∘max = max∘relu,
// gradients included), a ReLU after a convolution inside the
// convolution, and a ReLU after a batch norm inside the batch norm
// (BatchNorm2d.ReLU; the ReLU layer stays in the list, marked Fused, so
// layer indices and checkpointing blocks do not move). Parameter names
// and results are unchanged.
//
// The batch-norm architectures (resnet8, resnet18, se-resnet8,
// mobilenet, convvit) run their convolutions' forward and input-gradient
// products, and Winograd's dU, on kernels.GemmChain where the CPU has
// AVX-512 (Conv2D.Chain): each output is one multiply-add chain in a
// fixed order, so a 1×1 convolution on small planes can run its whole
// batch as one product and still give every sample the values it gets
// alone (the threads' slices stay consistent). Their results differ from
// the OpenBLAS path in the last bits; the other architectures keep Gemm.
package models
