// Command plot draws docs/experiments/fedavg-dirichlet/results.csv as
// accuracy.png and accuracy.svg (test accuracy per round, mean over seeds,
// one panel per Dirichlet alpha, one colour per method; the bottom row zooms
// in on the second half of training) and prints the README's tables.
//
// Run from the repository root: go run ./docs/experiments/fedavg-dirichlet/plot
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"image/color"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

var methods = []string{"fedavg", "fedprox", "fedavgm", "fedadam", "fedavg-cb"}

var labels = map[string]string{
	"fedavg":    "FedAvg",
	"fedprox":   "FedProx (μ=0.01)",
	"fedavgm":   "FedAvgM",
	"fedadam":   "FedAdam",
	"fedavg-cb": "FedAvg + class-balanced",
}

// run is one row of results.csv.
type run struct {
	alpha, method string
	seed          string
	acc           []float64 // per round, in percent
}

func main() {
	dir := flag.String("dir", "docs/experiments/fedavg-dirichlet", "folder holding results.csv; the plot is written there")
	lastK := flag.Int("last", 5, "also tabulate the mean of the last K rounds")
	flag.Parse()
	runs, err := readResults(filepath.Join(*dir, "results.csv"))
	if err != nil {
		log.Fatal(err)
	}
	alphas := uniq(runs, func(r run) string { return r.alpha })
	slices.SortFunc(alphas, func(a, b string) int { return cmpFloat(a, b) })

	printTable(runs, alphas, "final", func(acc []float64) float64 { return acc[len(acc)-1] })
	printTable(runs, alphas, fmt.Sprintf("last%d", *lastK), func(acc []float64) float64 {
		return mean(acc[max(0, len(acc)-*lastK):])
	})

	if err := draw2(runs, alphas, filepath.Join(*dir, "accuracy")); err != nil {
		log.Fatal(err)
	}
}

func readResults(path string) ([]run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 || rows[0][0] != "alpha" || rows[0][4] != "r1" {
		return nil, fmt.Errorf("%s: unexpected header %v", path, rows[0])
	}
	var out []run
	for _, row := range rows[1:] {
		r := run{alpha: row[0], method: row[1], seed: row[2]}
		for _, s := range row[4:] {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", path, err)
			}
			r.acc = append(r.acc, 100*v)
		}
		out = append(out, r)
	}
	return out, nil
}

// printTable prints a Markdown table: rows alpha, columns methods, cells the
// mean ± sample standard deviation over seeds of stat(per-round accuracy).
func printTable(runs []run, alphas []string, name string, stat func([]float64) float64) {
	fmt.Printf("\n%s test accuracy (%%), mean ± sd over seeds\n\n", name)
	fmt.Printf("| α |")
	for _, m := range methods {
		fmt.Printf(" %s |", labels[m])
	}
	fmt.Printf("\n|---|%s\n", strings.Repeat("---|", len(methods)))
	for _, a := range alphas {
		fmt.Printf("| %s |", a)
		for _, m := range methods {
			var vs []float64
			for _, r := range runs {
				if r.alpha == a && r.method == m {
					vs = append(vs, stat(r.acc))
				}
			}
			if len(vs) == 0 {
				fmt.Printf(" – |")
				continue
			}
			fmt.Printf(" %.2f ± %.2f |", mean(vs), sd(vs))
		}
		fmt.Println()
	}
}

// meanCurve is the per-round mean over the seeds of (alpha, method).
func meanCurve(runs []run, alpha, method string) plotter.XYs {
	var sum []float64
	n := 0
	for _, r := range runs {
		if r.alpha != alpha || r.method != method {
			continue
		}
		if sum == nil {
			sum = make([]float64, len(r.acc))
		}
		for i, v := range r.acc {
			sum[i] += v
		}
		n++
	}
	xys := make(plotter.XYs, len(sum))
	for i, s := range sum {
		xys[i].X, xys[i].Y = float64(i+1), s/float64(n)
	}
	return xys
}

// draw2 writes base.png and base.svg: a 2×len(alphas) grid, top row all
// rounds on one shared y range, bottom row the second half of the rounds,
// each panel with its own y range.
func draw2(runs []run, alphas []string, base string) error {
	nSeeds := len(uniq(runs, func(r run) string { return r.seed }))
	rounds := len(runs[0].acc)
	topLo, topHi := math.Inf(1), math.Inf(-1)
	for _, a := range alphas {
		for _, m := range methods {
			for _, pt := range meanCurve(runs, a, m) {
				topLo, topHi = math.Min(topLo, pt.Y), math.Max(topHi, pt.Y)
			}
		}
	}
	grid := make([][]*plot.Plot, 2)
	for row := range grid {
		for col, a := range alphas {
			p := plot.New()
			p.Add(plotter.NewGrid())
			p.X.Label.Text = "round"
			p.Y.Label.Text = "test accuracy (%)"
			from := 1
			if row == 0 {
				p.Title.Text = fmt.Sprintf("Dirichlet α = %s", a)
			} else {
				from = rounds/2 + 1
				p.Title.Text = fmt.Sprintf("α = %s, rounds %d–%d (zoom)", a, from, rounds)
			}
			p.Title.TextStyle.Font.Size = vg.Points(13)
			lo, hi := math.Inf(1), math.Inf(-1)
			for i, m := range methods {
				xys := meanCurve(runs, a, m)
				if len(xys) == 0 {
					continue
				}
				xys = xys[from-1:]
				for _, pt := range xys {
					lo, hi = math.Min(lo, pt.Y), math.Max(hi, pt.Y)
				}
				l, err := plotter.NewLine(xys)
				if err != nil {
					return err
				}
				l.Color = plotutil.Color(i)
				l.Width = vg.Points(1.6)
				l.Dashes = plotutil.Dashes(i)
				p.Add(l)
				if row == 0 && col == 0 {
					p.Legend.Add(labels[m], l)
				}
			}
			p.X.Min, p.X.Max = float64(from), float64(rounds)
			p.X.Tick.Marker = roundTicks{}
			if row == 0 {
				// The top row shares one y range so the panels compare across α.
				lo, hi = topLo, topHi
			}
			pad := (hi - lo) * 0.05
			p.Y.Min, p.Y.Max = lo-pad, math.Min(100, hi+pad)
			if row == 0 && col == 0 {
				p.Legend.Top = false
				p.Legend.Left = false
				p.Legend.TextStyle.Font.Size = vg.Points(10)
				p.Legend.Padding = vg.Points(2)
			}
			grid[row] = append(grid[row], p)
		}
	}
	title := fmt.Sprintf("MNIST MLP, 20 clients, 5 per round, E=1, B=32: test accuracy per round (mean of %d seeds)", nSeeds)
	w, h := vg.Length(5*len(alphas))*vg.Inch, 8*vg.Inch
	render := func(c draw.Canvas) {
		top := c.Max.Y - vg.Points(26)
		c.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 16), XAlign: draw.XCenter, YAlign: draw.YBottom,
			Handler: plot.DefaultTextHandler},
			vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: top + vg.Points(6)}, title)
		inner := draw.Crop(c, 0, 0, 0, -vg.Points(30))
		tiles := draw.Tiles{Rows: 2, Cols: len(alphas), PadX: vg.Points(14), PadY: vg.Points(14),
			PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
		canvases := plot.Align(grid, tiles, inner)
		for r := range grid {
			for col := range grid[r] {
				grid[r][col].Draw(canvases[r][col])
			}
		}
	}
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100), vgimg.UseBackgroundColor(color.White))
	render(draw.New(img))
	if err := writeTo(base+".png", vgimg.PngCanvas{Canvas: img}); err != nil {
		return err
	}
	svg := vgsvg.NewWith(vgsvg.UseWH(w, h))
	render(draw.New(svg))
	return writeTo(base+".svg", svg)
}

func writeTo(path string, wt io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := wt.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// roundTicks labels every 10th round and marks every 5th.
type roundTicks struct{}

func (roundTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for x := math.Ceil(lo/5) * 5; x <= hi; x += 5 {
		t := plot.Tick{Value: x}
		if int(x)%10 == 0 {
			t.Label = strconv.Itoa(int(x))
		}
		ts = append(ts, t)
	}
	return ts
}

func uniq(runs []run, key func(run) string) []string {
	var out []string
	for _, r := range runs {
		if k := key(r); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func cmpFloat(a, b string) int {
	x, _ := strconv.ParseFloat(a, 64)
	y, _ := strconv.ParseFloat(b, 64)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func mean(vs []float64) float64 {
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

func sd(vs []float64) float64 {
	if len(vs) < 2 {
		return 0
	}
	m, s := mean(vs), 0.0
	for _, v := range vs {
		s += (v - m) * (v - m)
	}
	return math.Sqrt(s / float64(len(vs)-1))
}
