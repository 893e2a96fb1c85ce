package data

import (
	"fmt"
)

// Info describes the examples of a [Source] or [MultiSource]: how many, the
// shape every decoded image has, and the label space.
type Info struct {
	// Name says where the examples come from, e.g. "cifar10 train" or an
	// ImageFolder's split directory.
	Name string
	// N examples of C×H×W pixels each.
	N, C, H, W int
	// Classes is the size of the label space: every label is in
	// [0, Classes).
	Classes int
	// ClassNames, when known, has Classes entries: the name of each label
	// (an ImageFolder's folder names, CIFAR's meta files), or is nil when
	// they are not known. It is shared: do not modify it.
	ClassNames []string
}

// ImageSize returns the number of bytes of one decoded image, C*H*W.
func (in Info) ImageSize() int { return in.C * in.H * in.W }

// Pixels is what the streaming [Loader] needs of a data set: its shape and
// each example's decoded pixels. [Source] and [MultiSource] are Pixels.
//
// The contract, shared by every implementation in this package:
//
//   - Info is fixed when the value is made and cheap to call.
//   - Read(i, dst) decodes example i into dst, which must have length
//     Info().ImageSize(): C planes of H rows of W bytes (planar,
//     dst[(c*H+y)*W+x]), channels in R, G, B order (one plane for
//     grayscale), raw 0–255 values with no normalisation. The same i always
//     gives the same bytes.
//   - Read may be called from several goroutines at once; it does not
//     retain dst.
//   - An index outside [0, N) or a dst of the wrong length is a bug in the
//     caller and panics; a file that cannot be read or decoded is an error
//     that names the file.
type Pixels interface {
	Info() Info
	Read(i int, dst []uint8) error
}

// Source is a single-label data set that need not fit in memory: its
// pixels are decoded on demand by Read (see [Pixels] for the contract),
// while its labels are small and held in memory.
//
// Label(i) is example i's class, in [0, Info().Classes); it is safe for
// concurrent use, and an index out of range panics. Labels are int32 so
// that label spaces beyond 256 classes (ImageNet's 1000, or more) fit.
type Source interface {
	Pixels
	Label(i int) int32
}

// MultiSource is a multi-label data set: each example carries a set of
// classes (possibly empty). LabelSet(i) returns example i's classes in
// increasing order, each in [0, Info().Classes), without duplicates; the
// slice is shared and must not be modified. It is safe for concurrent use.
type MultiSource interface {
	Pixels
	LabelSet(i int) []int32
}

// checkRead panics when a Read call breaks the [Pixels] contract: those
// are bugs in the caller, not bad input.
func checkRead(what string, in Info, i int, dst []uint8) {
	if i < 0 || i >= in.N {
		panic(fmt.Sprintf("data: %s.Read: index %d out of range [0, %d)", what, i, in.N))
	}
	if len(dst) != in.ImageSize() {
		panic(fmt.Sprintf("data: %s.Read: dst has %d bytes, want C×H×W = %d×%d×%d = %d",
			what, len(dst), in.C, in.H, in.W, in.ImageSize()))
	}
}
