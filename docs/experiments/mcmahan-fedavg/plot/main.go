// Command plot draws docs/experiments/mcmahan-fedavg/rounds.csv as
// accuracy.png / accuracy.svg: test accuracy against wall-clock seconds, one
// line per method, with the 97 % and 99 % targets.
//
// Run from the repository root: go run ./docs/experiments/mcmahan-fedavg/plot
package main

import (
	"encoding/csv"
	"flag"
	"log"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	dir := flag.String("dir", "docs/experiments/mcmahan-fedavg", "folder holding rounds.csv")
	flag.Parse()
	f, err := os.Open(filepath.Join(*dir, "rounds.csv"))
	if err != nil {
		log.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		log.Fatal(err)
	}
	lines := map[string]plotter.XYs{}
	var order []string
	for _, r := range rows[1:] { // method, lr, round, test_accuracy, elapsed_seconds
		acc, err1 := strconv.ParseFloat(r[3], 64)
		sec, err2 := strconv.ParseFloat(r[4], 64)
		if err1 != nil || err2 != nil {
			log.Fatalf("bad row %v", r)
		}
		if _, ok := lines[r[0]]; !ok {
			order = append(order, r[0])
		}
		lines[r[0]] = append(lines[r[0]], plotter.XY{X: sec, Y: 100 * acc})
	}
	p := plot.New()
	p.Title.Text = "MNIST, 100 clients × 2 shards, C = 0.1, fedcnn"
	p.X.Label.Text = "wall-clock seconds"
	p.Y.Label.Text = "test accuracy (%)"
	for i, m := range order {
		l, err := plotter.NewLine(lines[m])
		if err != nil {
			log.Fatal(err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(m, l)
	}
	for _, target := range []float64{97, 99} {
		xmax := 0.0
		for _, xy := range lines {
			xmax = max(xmax, xy[len(xy)-1].X)
		}
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: target}, {X: xmax, Y: target}})
		if err != nil {
			log.Fatal(err)
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
	}
	p.Y.Min, p.Y.Max = 80, 100 // after the lines: the early rounds fall below
	p.Legend.Top, p.Legend.Left = false, false
	for _, ext := range []string{"png", "svg"} {
		if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(*dir, "accuracy."+ext)); err != nil {
			log.Fatal(err)
		}
	}
}
