package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Names of the streamed data sets, opened by [OpenSources].
const (
	ImageFolderSet = "imagefolder"
	CIFAR10        = "cifar10"
	CIFAR100       = "cifar100"
)

// SourceNames returns the streamed data sets' names, sorted.
func SourceNames() []string { return []string{CIFAR10, CIFAR100, ImageFolderSet} }

// LabelsCSV is the file whose presence in an ImageFolder's directory makes
// it a multi-label set (see [OpenLabelsCSV]).
const LabelsCSV = "labels.csv"

// SourceOptions says which streamed data set to open and how.
type SourceOptions struct {
	// Name is one of SourceNames().
	Name string
	// Dir is the data set's folder (required).
	Dir string
	// Image says how an ImageFolder's images are decoded (size, channels);
	// it must be zero for CIFAR, whose shape is fixed.
	Image ImageFolderOptions
	// Labels is CIFAR-100's granularity; it must be Fine for the others.
	Labels CIFARLabels
}

// Sources are the two splits of an opened data set: each a [Source], or
// a [MultiSource] when MultiLabel. Close releases their files.
type Sources struct {
	Train, Test Pixels
	MultiLabel  bool
	close       func() error
}

// Close closes the splits' files (CIFAR keeps its files open).
func (s *Sources) Close() error {
	if s == nil || s.close == nil {
		return nil
	}
	return s.close()
}

// OpenSources opens the train and test splits of a streamed data set:
// "imagefolder" ([OpenImageFolder], or [OpenLabelsCSV] when Dir holds a
// labels.csv), "cifar10" ([OpenCIFAR10]) or "cifar100" ([OpenCIFAR100]).
// Errors name the file or folder at fault.
func OpenSources(ctx context.Context, opt SourceOptions) (*Sources, error) {
	if opt.Dir == "" {
		return nil, fmt.Errorf("data: %s: no data folder given (the data set's directory is required)", opt.Name)
	}
	if opt.Labels != Fine && opt.Name != CIFAR100 {
		return nil, fmt.Errorf("data: %s: label granularity %v applies to cifar100 only", opt.Name, opt.Labels)
	}
	if opt.Name != ImageFolderSet && opt.Image != (ImageFolderOptions{}) {
		return nil, fmt.Errorf("data: %s: images are 3×%d×%d; image size and channels apply to imagefolder only", opt.Name, CIFARSide, CIFARSide)
	}
	if fi, err := os.Stat(opt.Dir); err != nil {
		return nil, fmt.Errorf("data: %s: %w", opt.Name, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("data: %s: %s is not a directory", opt.Name, opt.Dir)
	}
	switch opt.Name {
	case ImageFolderSet:
		if _, err := os.Stat(filepath.Join(opt.Dir, LabelsCSV)); err == nil {
			tr, te, err := OpenLabelsCSV(ctx, opt.Dir, opt.Image)
			if err != nil {
				return nil, err
			}
			return &Sources{Train: tr, Test: te, MultiLabel: true}, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("data: %w", err)
		}
		tr, te, err := OpenImageFolder(ctx, opt.Dir, opt.Image)
		if err != nil {
			return nil, err
		}
		return &Sources{Train: tr, Test: te}, nil
	case CIFAR10, CIFAR100:
		var tr, te *CIFAR
		var err error
		if opt.Name == CIFAR10 {
			tr, te, err = OpenCIFAR10(opt.Dir)
		} else {
			tr, te, err = OpenCIFAR100(opt.Dir, opt.Labels)
		}
		if err != nil {
			return nil, err
		}
		return &Sources{Train: tr, Test: te, close: func() error { return errors.Join(tr.Close(), te.Close()) }}, nil
	}
	return nil, fmt.Errorf("data: unknown streamed data set %q; known: %s", opt.Name, strings.Join(SourceNames(), ", "))
}
