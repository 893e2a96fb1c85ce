// Package tensorpar holds model-parallel layers that split one layer's
// parameters over the ranks of a group (issue #17):
//
//   - the label-sharded classifier head (head.go), whose classes are split
//     over L ranks and whose softmax cross-entropy never puts all logits
//     on one rank;
//   - the Megatron-style tensor-parallel MLP block (mlp.go, Shoeybi et
//     al. 2019 §3): fc1 column-parallel and fc2 row-parallel around a
//     GELU, the hidden units split over L ranks (Span; uneven shards when
//     L does not divide them), with exactly one all-reduce in forward (g,
//     after fc2) and one in backward (f, the input gradient).
//
// The ranks talk through a Group (group.go), a collective interface small
// enough for the in-memory ring of tests and the gRPC ring of jobs:
// RingGroup implements it over any aggregator.Ring, tagging every frame
// with the group's id so that frames of another group are refused
// (aggregator.ErrUnexpectedFrame) and never used. Counting wraps a Group
// and counts operations and values, so tests check the communication of a
// step against its formula exactly.
//
// Each sharded layer copies its shard out of the whole layer's tensors in
// PyTorch's layout (SetFromFull), and the MLP also back into them
// (CopyParamsTo, CopyGradsTo), so tests compare it with the unsharded
// layers of models.
package tensorpar
