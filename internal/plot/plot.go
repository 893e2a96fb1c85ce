// Package plot draws a run directory's metrics.jsonl (see internal/runlog)
// as charts next to it: training loss per step, test accuracy per epoch or
// federated round, and throughput per step, each as SVG and PNG.
//
// RenderRun may be called while the job is still writing metrics.jsonl; it
// plots every complete line and ignores a last line cut short. Files are
// replaced atomically, so a viewer never sees half a chart.
package plot

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart size and PNG resolution: 6×4 in at 100 dpi is a 600×400 image.
const (
	width  = 6 * vg.Inch
	height = 4 * vg.Inch
	dpi    = 100
)

// Base names of the charts RenderRun writes; each is written as name+".svg"
// and name+".png".
const (
	LossChart       = "loss"
	AccuracyChart   = "accuracy"
	ThroughputChart = "throughput"
)

// ErrNoData is returned (wrapped) by RenderRun when metrics.jsonl holds no
// step or evaluation records, for example when a job failed before its
// first step.
var ErrNoData = errors.New("plot: no progress or evaluation records")

// RenderRun reads dir/metrics.jsonl and writes, into dir, loss.svg/.png
// (training loss per step), accuracy.svg/.png (test accuracy in percent
// per epoch, or per round when the records carry "round") and
// throughput.svg/.png (images per second per step). Records that carry a
// "rank" field are drawn as one line per rank, with a legend.
//
// A chart with no data is not written. RenderRun returns an error wrapping
// [io/fs.ErrNotExist] when metrics.jsonl is missing, and one wrapping ErrNoData
// when no chart has data.
func RenderRun(dir string) error {
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	d, err := readMetrics(f)
	f.Close()
	if err != nil {
		return err
	}
	job := filepath.Base(filepath.Clean(dir))
	charts := []struct {
		name   string
		title  string
		xLabel string
		yLabel string
		lines  []series
		style  style
	}{
		{LossChart, job + ": training loss", "step", "loss", sortedSeries(d.loss), style{legendTop: true}},
		{AccuracyChart, job + ": test accuracy", accuracyX(d), "test accuracy (%)", percent(sortedSeries(d.accuracy)), style{marks: true}},
		{ThroughputChart, job + ": throughput", "step", "images/s", sortedSeries(d.throughput), style{}},
	}
	wrote := false
	for _, c := range charts {
		if len(c.lines) == 0 {
			continue
		}
		p, err := newChart(c.title, c.xLabel, c.yLabel, c.lines, c.style)
		if err != nil {
			return fmt.Errorf("plot: %s: %w", c.name, err)
		}
		if err := save(p, filepath.Join(dir, c.name)); err != nil {
			return err
		}
		wrote = true
	}
	if !wrote {
		if d.skipped > 0 {
			return fmt.Errorf("%w in %s (%d unreadable lines)", ErrNoData, filepath.Join(dir, "metrics.jsonl"), d.skipped)
		}
		return fmt.Errorf("%w in %s", ErrNoData, filepath.Join(dir, "metrics.jsonl"))
	}
	return nil
}

func accuracyX(d *runData) string {
	if d.byRound {
		return "round"
	}
	return "epoch"
}

// percent scales accuracies logged as fractions (runlog logs 0..1) to
// percent. A run whose accuracies are all at most 1 is taken to be in
// fractions; accuracies already in percent pass through unchanged.
func percent(lines []series) []series {
	maxY := math.Inf(-1)
	for _, s := range lines {
		for _, p := range s.points {
			maxY = math.Max(maxY, p.y)
		}
	}
	if maxY > 1 {
		return lines
	}
	for _, s := range lines {
		for i := range s.points {
			s.points[i].y *= 100
		}
	}
	return lines
}

// style is how a chart differs from the others.
type style struct {
	// marks draws each sample as a dot: accuracy has one per epoch.
	marks bool
	// legendTop puts the legend at the top right rather than the bottom
	// right: loss falls and accuracy rises, so that is where they leave room.
	legendTop bool
}

// newChart builds a line chart. Each line's points are sorted by x and
// finite.
func newChart(title, xLabel, yLabel string, lines []series, st style) (*gplot.Plot, error) {
	p := gplot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.X.Tick.Marker = plainTicks{}
	p.Y.Tick.Marker = plainTicks{}
	p.Add(plotter.NewGrid())
	p.Legend.Top = st.legendTop
	for i, s := range lines {
		if len(s.points) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(s.points))
		for j, pt := range s.points {
			xys[j].X, xys[j].Y = pt.x, pt.y
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		// One sample draws no line; mark it so the chart is not blank.
		if st.marks || len(xys) == 1 {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: l.Color, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
			p.Add(sc)
		}
		if len(lines) > 1 {
			p.Legend.Add(seriesName(s.rank), l)
		}
	}
	return p, nil
}

func seriesName(rank int64) string {
	if rank == noRank {
		return "job"
	}
	return fmt.Sprintf("rank %d", rank)
}

// save writes p as base+".svg" and base+".png".
func save(p *gplot.Plot, base string) error {
	svg := vgsvg.NewWith(vgsvg.UseWH(width, height))
	p.Draw(draw.New(svg))
	if err := writeAtomic(base+".svg", svg); err != nil {
		return err
	}
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	p.Draw(draw.New(img))
	return writeAtomic(base+".png", fastPNG{img})
}

// fastPNG encodes a canvas as PNG at zlib's fastest level: charts are
// redrawn after every evaluation, and at the default level zlib cost more
// than drawing them (under -race, most of the server tests' plotting
// time). The image is the same; only the file's compression differs.
type fastPNG struct{ c *vgimg.Canvas }

func (f fastPNG) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	err := enc.Encode(cw, f.c.Image())
	return cw.n, err
}

// countWriter counts the bytes written through it (for io.WriterTo).
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeAtomic writes through a temporary file and a rename, so a viewer
// refreshing the chart during a run never reads half a file.
func writeAtomic(path string, w io.WriterTo) error {
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return fmt.Errorf("plot: %s: %w", filepath.Base(path), err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	_, err = tmp.Write(buf.Bytes())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// plainTicks are gonum/plot's default ticks labelled in the shortest form
// ("250", "0.3", "4750"), not with a fixed number of decimals.
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []gplot.Tick {
	ts := gplot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'g', 6, 64)
		}
	}
	return ts
}
