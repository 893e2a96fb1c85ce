package data

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Streams of the colour set's draws, apart from the package's others.
const (
	streamColorTrain uint64 = 0x636f6c7472 // "coltr"
	streamColorTest  uint64 = 0x636f6c7465 // "colte"
)

// Colour set geometry: CIFAR-100's label spaces, each coarse class a hue
// and each of its five fine classes a shape drawn in that hue.
const (
	colorCoarse = 20
	colorShapes = 5
	colorNoise  = 0.08 // per-pixel, per-channel noise sd, [0, 1] scale
	colorJitter = 4    // max shift of the shape's centre, pixels
)

var colorShapeNames = [colorShapes]string{"square", "disc", "hbar", "vbar", "ring"}

// ColorSet returns n examples of a deterministic, learnable synthetic
// colour set in CIFAR-100's form: coarse labels (20), fine labels (100,
// fine/5 = coarse) and pixels, (n, 3, 32, 32) planar R, G, B. Coarse class
// k is a hue (k·18°); its five fine classes are a square, a disc, a
// horizontal bar, a vertical bar and a ring drawn in that hue on a gray
// background of random brightness, with random size, position (±4 px),
// saturation and brightness, and Gaussian pixel noise. The hue alone gives
// the coarse class; the fine class also needs the shape, so a linear model
// learns coarse labels quickly and fine ones more slowly. Fine labels are
// balanced and in random order; test selects an independent stream, so
// the train and test splits of one seed share no draws. The same arguments
// give the same bytes (across Go releases: the draws are the package's own;
// an architecture that fuses multiply-adds could move a rare pixel by one
// level).
func ColorSet(n int, seed int64, test bool) (coarse, fine, pix []uint8) {
	stream := streamColorTrain
	if test {
		stream = streamColorTest
	}
	r := newRNG(seed, stream)
	fine = make([]uint8, n)
	for i := range fine {
		fine[i] = uint8(i % (colorCoarse * colorShapes))
	}
	shuffle(&r, fine)
	coarse = make([]uint8, n)
	pix = make([]uint8, n*cifarPixels)
	const side, plane = CIFARSide, CIFARSide * CIFARSide
	for i, f := range fine {
		coarse[i] = f / colorShapes
		hue := (float64(coarse[i]) + 0.3*(r.float64()-0.5)) / colorCoarse
		sat := 0.8 + 0.2*r.float64()
		val := 0.8 + 0.2*r.float64()
		cr, cg, cb := hsv(hue, sat, val)
		bg := 0.2 + 0.2*r.float64()
		cx := 15.5 + float64(r.intn(2*colorJitter+1)-colorJitter)
		cy := 15.5 + float64(r.intn(2*colorJitter+1)-colorJitter)
		rad := 6 + 4*r.float64()
		img := pix[i*cifarPixels : (i+1)*cifarPixels]
		for y := range side {
			for x := range side {
				in := inShape(int(f%colorShapes), float64(x)-cx, float64(y)-cy, rad)
				for c, v := range [3]float64{cr, cg, cb} {
					if !in {
						v = bg
					}
					v += colorNoise * r.approxNormal()
					img[c*plane+y*side+x] = uint8(255*min(max(v, 0), 1) + 0.5)
				}
			}
		}
	}
	return coarse, fine, pix
}

// inShape reports whether the offset (dx, dy) from the centre is inside
// shape s of radius r.
func inShape(s int, dx, dy, r float64) bool {
	ax, ay := math.Abs(dx), math.Abs(dy)
	switch s {
	case 0: // square
		return ax <= r && ay <= r
	case 1: // disc
		return dx*dx+dy*dy <= r*r
	case 2: // horizontal bar
		return ay <= r/3 && ax <= r+3
	case 3: // vertical bar
		return ax <= r/3 && ay <= r+3
	default: // ring
		d := math.Sqrt(dx*dx + dy*dy)
		return d <= r && d >= r/2
	}
}

// hsv converts hue (turns), saturation and value in [0, 1] to RGB.
func hsv(h, s, v float64) (r, g, b float64) {
	h -= math.Floor(h)
	h6 := h * 6
	k := int(h6) % 6
	f := h6 - math.Floor(h6)
	p, q, t := v*(1-s), v*(1-s*f), v*(1-s*(1-f))
	return hexSector(k, v, p, q, t)
}

// ColorSetNames returns the colour set's coarse and fine class names, in
// label order ("hue018", "hue018-disc", …).
func ColorSetNames() (coarse, fine []string) {
	for k := range colorCoarse {
		coarse = append(coarse, fmt.Sprintf("hue%03d", k*360/colorCoarse))
		for _, s := range colorShapeNames {
			fine = append(fine, fmt.Sprintf("hue%03d-%s", k*360/colorCoarse, s))
		}
	}
	return coarse, fine
}

// WriteColorSet writes the colour set (see [ColorSet]) into dir as
// CIFAR-100's binary version: train.bin with nTrain records, test.bin
// with nTest, fine_label_names.txt and coarse_label_names.txt, so that
// [OpenCIFAR100] reads it. dir is created if need be.
func WriteColorSet(dir string, nTrain, nTest int, seed int64) error {
	if nTrain < 1 || nTest < 1 {
		return fmt.Errorf("data: colour set: split sizes must be ≥ 1, got train %d, test %d", nTrain, nTest)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	for _, s := range []struct {
		name string
		n    int
		test bool
	}{{"train.bin", nTrain, false}, {"test.bin", nTest, true}} {
		c, f, pix := ColorSet(s.n, seed, s.test)
		if err := os.WriteFile(filepath.Join(dir, s.name), EncodeCIFAR100(c, f, pix), 0o644); err != nil {
			return fmt.Errorf("data: %w", err)
		}
	}
	coarse, fine := ColorSetNames()
	for name, names := range map[string][]string{"coarse_label_names.txt": coarse, "fine_label_names.txt": fine} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
			return fmt.Errorf("data: %w", err)
		}
	}
	return nil
}
