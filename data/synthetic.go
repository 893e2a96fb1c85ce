package data

import (
	"fmt"
	"math"
)

// Synthetic set geometry.
const (
	syntheticClasses = 10
	syntheticSide    = 28
	syntheticBlobs   = 4    // Gaussian blobs per class template
	syntheticNoise   = 0.25 // per-pixel noise sd, [0, 1] scale
	syntheticShift   = 1    // max translation, pixels
)

// Synthetic returns a deterministic, seeded, learnable 10-class data set of
// 1×28×28 images: each class has a template made of a few Gaussian blobs;
// an example is its class template, randomly shifted by up to one pixel,
// scaled in brightness and overlaid with (approximately) Gaussian noise, quantised to bytes
// like a real image file and standardised like the real data sets. Labels are
// balanced (as equal as nTrain and nTest allow) and in random order. The same
// seed gives the same templates for both splits and the same bytes on every
// platform; a simple linear model separates the classes within a few epochs.
func Synthetic(nTrain, nTest int, seed int64) (train, test *Dataset, err error) {
	if nTrain < 1 || nTest < 1 {
		return nil, nil, fmt.Errorf("data: synthetic: split sizes must be ≥ 1, got train %d, test %d", nTrain, nTest)
	}
	if nTrain > MaxIDXBytes/(syntheticSide*syntheticSide) || nTest > MaxIDXBytes/(syntheticSide*syntheticSide) {
		return nil, nil, fmt.Errorf("data: synthetic: split sizes must be ≤ %d, got train %d, test %d",
			MaxIDXBytes/(syntheticSide*syntheticSide), nTrain, nTest)
	}
	rt, rtr, rte := newRNG(seed, streamSyntheticTemplates), newRNG(seed, streamSyntheticTrain), newRNG(seed, streamSyntheticTest)
	templates := syntheticTemplates(&rt)
	tr := syntheticSplit(&rtr, templates, nTrain)
	te := syntheticSplit(&rte, templates, nTest)
	return newDatasets(SyntheticSet, syntheticClasses, tr, te)
}

// syntheticTemplates returns one 28×28 template per class, values in [0, 1].
func syntheticTemplates(r *rng) [][]float64 {
	const side = syntheticSide
	out := make([][]float64, syntheticClasses)
	for k := range out {
		t := make([]float64, side*side)
		for range syntheticBlobs {
			cx := 5 + 18*r.float64()
			cy := 5 + 18*r.float64()
			sigma := 1.5 + 2.5*r.float64()
			amp := 0.6 + 0.4*r.float64()
			for y := range side {
				for x := range side {
					dx, dy := float64(x)-cx, float64(y)-cy
					t[y*side+x] += amp * math.Exp(-(dx*dx+dy*dy)/(2*sigma*sigma))
				}
			}
		}
		for i, v := range t {
			t[i] = min(v, 1)
		}
		out[k] = t
	}
	return out
}

func syntheticSplit(r *rng, templates [][]float64, n int) split {
	const side = syntheticSide
	labels := make([]uint8, n)
	for i := range labels {
		labels[i] = uint8(i % syntheticClasses)
	}
	shuffle(r, labels)
	pix := make([]uint8, n*side*side)
	for i, l := range labels {
		t := templates[l]
		dx := r.intn(2*syntheticShift+1) - syntheticShift
		dy := r.intn(2*syntheticShift+1) - syntheticShift
		scale := 0.8 + 0.4*r.float64()
		img := pix[i*side*side : (i+1)*side*side]
		for y := range side {
			for x := range side {
				v := 0.0
				if sx, sy := x-dx, y-dy; sx >= 0 && sx < side && sy >= 0 && sy < side {
					v = scale * t[sy*side+sx]
				}
				v += syntheticNoise * r.approxNormal()
				img[y*side+x] = uint8(255*min(max(v, 0), 1) + 0.5)
			}
		}
	}
	return split{pix: pix, labels: labels, n: n, c: 1, h: side, w: side}
}
