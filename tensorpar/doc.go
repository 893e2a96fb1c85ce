// Package tensorpar holds model-parallel layers that split one layer's
// parameters over the ranks of a group (issue #17):
//
//   - the label-sharded classifier head (head.go), whose classes are split
//     over L ranks and whose softmax cross-entropy never puts all logits
//     on one rank; its multi-label BCE-with-logits loss (bce.go: the
//     terms split by class, one all-reduce of b values for the loss's
//     value, none for the gradient); and its evaluation from the shards
//     (headeval.go): the predicted class (the global arg-max, for
//     eval.Confusion), and each label's rank among all classes, from
//     which top-k accuracy follows for every k (two all-reduces of b
//     values, whatever k);
//   - the Megatron-style tensor-parallel MLP block (mlp.go, Shoeybi et
//     al. 2019 §3): fc1 column-parallel and fc2 row-parallel around a
//     GELU, the hidden units split over L ranks (Span; uneven shards when
//     L does not divide them), with exactly one all-reduce in forward (g,
//     after fc2) and one in backward (f, the input gradient);
//   - Megatron's attention split by heads (attention.go): the packed
//     q/k/v in-projection column-parallel by heads (each rank its heads'
//     rows of in_proj_weight in each of the q, k and v blocks; uneven head
//     counts allowed, T > Heads refused), out_proj row-parallel, again
//     one all-reduce forward and one backward, b·s·D values each;
//   - the tensor-parallel pre-norm transformer block (block.go), vit-tiny's
//     x += attn(norm1(x)); x += mlp(norm2(x)) from the two, its layer norms
//     and residual adds replicated: exactly 2 all-reduces of b·s·D values
//     forward and 2 backward, Megatron's four per layer;
//   - 2D tensor parallelism for Linear (linear2d.go, Optimus: Xu et al.
//     2021, over SUMMA): the weight in q×q blocks, the activations in q
//     blocks along both the batch and the features, each rank talking to
//     its grid row and its grid column through a Group each; forward is
//     q broadcasts along the row (input blocks) and q down the column
//     (weight blocks), backward broadcasts them again and reduces the
//     products (all-reduces: Group has no Reduce);
//   - the spatially sharded convolution (spatial.go, DistConv: Dryden et
//     al. 2019), models.Conv2D's function over images whose rows are split
//     into F strips (Strips; uneven allowed): each rank receives the input
//     rows its windows read from its strip neighbours (the halo, HaloRows:
//     from kernel, stride, padding and dilation) before its convolution,
//     and sends them their gradients in backward; the replicated weight's
//     gradient is each rank's share, to be summed with the data-parallel
//     all-reduce;
//   - the max and average pools over strips (SpatialPool), with the same
//     halo machinery (rowHalo);
//   - the batch norm over strips (spatialnorm.go), whose training
//     statistics are the whole images': partial sums all-reduced over the
//     spatial ranks' Group, 2 all-reduces of C values forward, 1 of 2C
//     backward;
//   - Fuse (fuse.go), which all-gathers the strips into whole images
//     before a replicated head.
//
// The ranks talk through a Group (group.go), a collective interface small
// enough for the in-memory ring of tests and the gRPC ring of jobs
// (all-reduce, all-gather, broadcast):
// RingGroup implements it over any aggregator.Ring, tagging every frame
// with the group's id so that frames of another group are refused
// (aggregator.ErrUnexpectedFrame) and never used. Counting wraps a Group
// and counts operations and values, so tests check the communication of a
// step against its formula exactly.
//
// Spatial ranks talk point to point through a Halo (halo.go): one
// Exchange sends a frame to each strip neighbour and receives one from
// each. Its frames (HaloFrame: group, exchange number, sender, side,
// values; EncodeHaloFrame, DecodeHaloFrame, fuzzed) are checked on
// arrival, and a frame of another group, sender, side, exchange or length
// is refused and never used. MemHalo is the in-memory implementation for
// tests; the gRPC one is to come over the pipeline's peer links (one
// bidirectional stream per neighbouring pair, as pipeline/peerrpc), or
// over two rings (one per direction). CountingHalo counts the values
// exchanged per side, so tests check them against the formula exactly.
//
// The row-parallel half (fc2, out_proj) is one piece of code
// (rowparallel.go), and so is the shape handshake every constructor does
// (agree: one Max all-reduce of the sizes and their negatives).
//
// Each sharded layer copies its shard out of the whole layer's tensors in
// PyTorch's layout (SetFromFull) and back into them (CopyParamsTo,
// CopyGradsTo), so tests compare it with the unsharded layers of models;
// GatherParams does the latter over the group (one all-gather of the
// longest shard per layer; for Linear2D one down the grid column, then
// one along the row), so that every rank holds the whole tensors a
// checkpoint writes under PyTorch's names.
//
// Jobs: the label-sharded head runs in label-sharded jobs
// (parallelism.label_shards, worker/tplabel.go); the MLP, with ReLU and
// no input gradient (MLPOptions), in tensor-parallel mlp jobs, and the
// block (attention and MLP) in tensor-parallel vit-tiny jobs
// (parallelism.tensor, worker/tptensor.go), each Group a RingGroup over a
// gRPC ring of one data replica's ranks. Linear2D and spatial sharding
// are not in jobs yet.
package tensorpar
