// Command plot draws the McMahan reproduction's evaluations as two figures:
// accuracy-rounds.{png,svg} (test accuracy against communication rounds, the
// paper's axis) and accuracy-cpu.{png,svg} (against the CPU seconds the run
// had used, both cores together: the machine's budget), one line per method,
// with the 97 % and 99 % targets.
//
// Run from the repository root:
//
//	go run ./docs/experiments/mcmahan-fedavg/plot [-csv rounds-99.csv]
//
// The CSV columns are those run.sh writes: method, lr, round,
// test_accuracy, elapsed_seconds, cpu_seconds.
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

type series struct {
	name           string
	byRound, byCPU plotter.XYs
}

func main() {
	dir := flag.String("dir", "docs/experiments/mcmahan-fedavg", "folder holding the CSV; the figures go there too")
	name := flag.String("csv", "rounds-99.csv", "the evaluations, in run.sh's columns")
	flag.Parse()
	f, err := os.Open(filepath.Join(*dir, *name))
	if err != nil {
		log.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		log.Fatal(err)
	}
	var all []*series
	byName := map[string]*series{}
	for _, r := range rows[1:] {
		rnd, err1 := strconv.ParseFloat(r[2], 64)
		acc, err2 := strconv.ParseFloat(r[3], 64)
		if err1 != nil || err2 != nil {
			log.Fatalf("bad row %v", r)
		}
		s := byName[r[0]]
		if s == nil {
			s = &series{name: r[0]}
			byName[r[0]] = s
			all = append(all, s)
		}
		s.byRound = append(s.byRound, plotter.XY{X: rnd, Y: 100 * acc})
		if cpu, err := strconv.ParseFloat(r[5], 64); err == nil {
			s.byCPU = append(s.byCPU, plotter.XY{X: cpu, Y: 100 * acc})
		}
	}
	draw(*dir, "accuracy-rounds", "communication rounds", all, func(s *series) plotter.XYs { return s.byRound })
	draw(*dir, "accuracy-cpu", "CPU seconds used (both cores)", all, func(s *series) plotter.XYs { return s.byCPU })
}

func draw(dir, file, xlabel string, all []*series, pick func(*series) plotter.XYs) {
	p := plot.New()
	p.Title.Text = "MNIST, 100 clients × 2 shards (Non-IID), C = 0.1, fedcnn"
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "test accuracy (%)"
	xmax := 0.0
	for i, s := range all {
		xy := pick(s)
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			log.Fatal(err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
		xmax = max(xmax, xy[len(xy)-1].X)
	}
	for _, target := range []float64{97, 99} {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: target}, {X: xmax, Y: target}})
		if err != nil {
			log.Fatal(err)
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
	}
	p.Y.Min, p.Y.Max = 90, 100 // after the lines: the early rounds fall below
	p.Legend.Top, p.Legend.Left = false, false
	for _, ext := range []string{"png", "svg"} {
		if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, file+"."+ext)); err != nil {
			log.Fatal(err)
		}
	}
}
