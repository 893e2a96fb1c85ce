// Package models holds the neural-network layers, losses and named
// architectures that gradsync trains.
//
// A Network keeps all its parameters in one flat []float32 and all its
// gradients in another of the same length and layout; each layer sees
// views (sub-slices) of them. Segments name each view with its PyTorch
// parameter name and layout (fc.weight is [out,in]), so reducers,
// optimisers, compressors and checkpoints work on the flat buffers while
// weights still move to and from PyTorch.
//
// Layers have explicit Forward and Backward passes over row-major float32
// batches. Activation and gradient buffers are owned by the layers and
// reused from step to step: once warmed up for a batch size, Forward and
// Backward do not allocate. Shape bugs panic with a "models: " prefix.
package models
