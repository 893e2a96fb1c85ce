// Command plot draws docs/experiments/compression/{accuracy,timing}.csv as
// compression.png and compression.svg (time per step of each method on each
// link; final test accuracy of each method on each dataset) and
// prints the README's tables.
//
// Run from the repository root: go run ./docs/experiments/compression/plot
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"image/color"
	"log"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

var methods = []string{"none", "fp16", "int8", "topk-1%", "powersgd-r1", "powersgd-r2", "powersgd-r4"}

// table is a CSV file as maps keyed by its first two columns.
type table map[[2]string]map[string]string

func read(path string) (table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	t := table{}
	for _, row := range rows[1:] {
		m := map[string]string{}
		for i, h := range rows[0] {
			m[h] = row[i]
		}
		t[[2]string{row[0], row[1]}] = m // a later run of the same key wins
	}
	return t, nil
}

func num(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func main() {
	dir := flag.String("dir", "docs/experiments/compression", "folder holding accuracy.csv and timing.csv")
	flag.Parse()
	acc, err := read(filepath.Join(*dir, "accuracy.csv"))
	if err != nil {
		log.Fatal(err)
	}
	tim, err := read(filepath.Join(*dir, "timing.csv"))
	if err != nil {
		log.Fatal(err)
	}
	datasets := []string{"mnist", "fashion-mnist"}
	links := []string{"loopback", "1Gbit", "100Mbit"}

	fmt.Println("| method | MNIST acc. % | Fashion acc. % | bytes/step (steady) | ratio | loopback s/step | 1 Gbit/s s/step | 100 Mbit/s s/step | compress % of step (loopback) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	raw := num(acc[[2]string{"mnist", "none"}]["raw_bytes_per_step"])
	for _, m := range methods {
		a := acc[[2]string{"mnist", m}]
		fa := acc[[2]string{"fashion-mnist", m}]
		sent := num(a["steady_sent_bytes_per_step"])
		fmt.Printf("| %s | %s | %s | %.0f | %.1f× |", m, pct(a["test_accuracy"]), pct(fa["test_accuracy"]), sent, raw/sent)
		for _, l := range links {
			fmt.Printf(" %s |", secs(tim[[2]string{l, m}]["seconds_per_step"]))
		}
		lb := tim[[2]string{"loopback", m}]
		fmt.Printf(" %.1f %% |\n", 100*num(lb["compress_seconds_per_step"])/num(lb["seconds_per_step"]))
	}

	left := plot.New()
	left.Title.Text = "time per step, cnn, 2 workers (ring)"
	left.Y.Label.Text = "seconds per step"
	w := vg.Points(9)
	for i, l := range links {
		v := plotter.Values{}
		for _, m := range methods {
			v = append(v, num(tim[[2]string{l, m}]["seconds_per_step"]))
		}
		b, err := plotter.NewBarChart(v, w)
		if err != nil {
			log.Fatal(err)
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = vg.Points(float64(i-1) * 9)
		left.Add(b)
		left.Legend.Add(l, b)
	}
	left.Legend.Top = true
	left.NominalX(methods...)

	right := plot.New()
	right.Title.Text = "final test accuracy, 3 epochs"
	right.Y.Label.Text = "test accuracy (%)"
	lo := 100.0
	for i, d := range datasets {
		v := plotter.Values{}
		for _, m := range methods {
			x := 100 * num(acc[[2]string{d, m}]["test_accuracy"])
			v = append(v, x)
			if !math.IsNaN(x) {
				lo = math.Min(lo, x)
			}
		}
		b, err := plotter.NewBarChart(v, w)
		if err != nil {
			log.Fatal(err)
		}
		b.Color = []color.Color{color.RGBA{R: 70, G: 110, B: 200, A: 255}, color.RGBA{R: 220, G: 120, B: 40, A: 255}}[i]
		b.LineStyle.Width = 0
		b.Offset = vg.Points(float64(2*i-1) * 4.5)
		right.Add(b)
		right.Legend.Add(d, b)
	}
	right.Y.Min = math.Floor(lo - 2)
	right.Y.Max = 100
	right.Legend.Top = true
	right.NominalX(methods...)
	for _, p := range []*plot.Plot{left, right} {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
	}

	const width, height = 12 * vg.Inch, 4.5 * vg.Inch
	for _, ext := range []string{"png", "svg"} {
		var c draw.Canvas
		var save func(*os.File) error
		switch ext {
		case "png":
			img := vgimg.New(width, height)
			c = draw.New(img)
			save = func(f *os.File) error { _, err := vgimg.PngCanvas{Canvas: img}.WriteTo(f); return err }
		case "svg":
			img := vgsvg.New(width, height)
			c = draw.New(img)
			save = func(f *os.File) error { _, err := img.WriteTo(f); return err }
		}
		tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 3, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
		for i, p := range []*plot.Plot{left, right} {
			p.Draw(tiles.At(c, i, 0))
		}
		f, err := os.Create(filepath.Join(*dir, "compression."+ext))
		if err != nil {
			log.Fatal(err)
		}
		if err := save(f); err != nil {
			log.Fatal(err)
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
}

func pct(s string) string {
	v := num(s)
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", 100*v)
}

func secs(s string) string {
	v := num(s)
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.3f", v)
}
