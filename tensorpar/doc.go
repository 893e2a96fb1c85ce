// Package tensorpar holds model-parallel layers that split one layer's
// parameters over the ranks of a group (issue #17): so far the
// label-sharded classifier head (head.go), whose classes are split over L
// ranks and whose softmax cross-entropy never puts all logits on one rank.
//
// The ranks talk through a Group (group.go), a collective interface small
// enough for the in-memory ring of tests and the gRPC ring of jobs:
// RingGroup implements it over any aggregator.Ring, tagging every frame
// with the group's id so that frames of another group are refused
// (aggregator.ErrUnexpectedFrame) and never used. Counting wraps a Group
// and counts operations and values, so tests check the communication of a
// step against its formula exactly.
package tensorpar
