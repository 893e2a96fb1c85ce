package plot

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// record is one line of metrics.jsonl, as written by runlog.Writer.Log.
// Fields are pointers so that "absent" and "zero" differ: a record without
// a rank belongs to the whole job, and a record with "round" is a
// federated round rather than an epoch.
type record struct {
	Kind            string   `json:"kind"`
	Step            *float64 `json:"step"`
	Epoch           *float64 `json:"epoch"`
	Round           *float64 `json:"round"`
	Rank            *int64   `json:"rank"`
	Loss            *float64 `json:"loss"`
	ImagesPerSecond *float64 `json:"images_per_second"`
	TestAccuracy    *float64 `json:"test_accuracy"`
}

// noRank is the series key of records that carry no "rank" field.
const noRank = -1

// point is one (x, y) sample of a series.
type point struct{ x, y float64 }

// series is a line on a chart: the samples of one rank (or of the whole job
// when rank is noRank).
type series struct {
	rank   int64
	points []point
}

// runData is what the charts need from metrics.jsonl.
type runData struct {
	loss       map[int64][]point // per rank: (step, loss)
	throughput map[int64][]point // per rank: (step, images/s)
	accuracy   map[int64][]point // per rank: (epoch or round, test accuracy)
	byRound    bool              // accuracy x values are federated rounds
	skipped    int               // lines that were not valid JSON objects
}

// readMetrics parses metrics.jsonl. Blank lines and lines that are not JSON
// objects are skipped and counted: the last line may be cut short while a
// writer is appending to the file, and a run's plots should still show
// everything before it. Non-finite values are dropped (JSON cannot carry
// them, but a hand-written file might try).
func readMetrics(r io.Reader) (*runData, error) {
	d := &runData{
		loss:       map[int64][]point{},
		throughput: map[int64][]point{},
		accuracy:   map[int64][]point{},
	}
	var (
		epochAcc = map[int64][]point{}
		roundAcc = map[int64][]point{}
	)
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var rec record
			if json.Unmarshal(line, &rec) != nil {
				d.skipped++
			} else {
				add(d, epochAcc, roundAcc, &rec)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("plot: reading metrics: %w", err)
		}
	}
	// Federated jobs log rounds; a file with both keeps the rounds, since
	// an epoch inside a round is a client-local count.
	if len(roundAcc) > 0 {
		d.accuracy, d.byRound = roundAcc, true
	} else {
		d.accuracy = epochAcc
	}
	return d, nil
}

func add(d *runData, epochAcc, roundAcc map[int64][]point, rec *record) {
	rank := int64(noRank)
	if rec.Rank != nil {
		rank = *rec.Rank
	}
	if rec.TestAccuracy != nil && finite(*rec.TestAccuracy) {
		switch {
		case rec.Round != nil && finite(*rec.Round):
			roundAcc[rank] = append(roundAcc[rank], point{*rec.Round, *rec.TestAccuracy})
		case rec.Epoch != nil && finite(*rec.Epoch):
			epochAcc[rank] = append(epochAcc[rank], point{*rec.Epoch, *rec.TestAccuracy})
		}
	}
	// An eval record's losses are test and train losses over a whole
	// epoch, not a step's training loss.
	if rec.Kind == "eval" || rec.Step == nil || !finite(*rec.Step) {
		return
	}
	if rec.Loss != nil && finite(*rec.Loss) {
		d.loss[rank] = append(d.loss[rank], point{*rec.Step, *rec.Loss})
	}
	if rec.ImagesPerSecond != nil && finite(*rec.ImagesPerSecond) {
		d.throughput[rank] = append(d.throughput[rank], point{*rec.Step, *rec.ImagesPerSecond})
	}
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// sortedSeries turns per-rank samples into lines ordered by rank, each with
// increasing x. When x repeats — a job that resumed from a checkpoint logs
// its steps again — the later sample wins, so the line shows the run that
// produced the final model.
func sortedSeries(m map[int64][]point) []series {
	out := make([]series, 0, len(m))
	for rank, pts := range m {
		last := make(map[float64]int, len(pts)) // x → index of its latest sample
		for i, p := range pts {
			last[p.x] = i
		}
		kept := make([]point, 0, len(last))
		for i, p := range pts {
			if last[p.x] == i {
				kept = append(kept, p)
			}
		}
		slices.SortStableFunc(kept, func(a, b point) int { return cmp.Compare(a.x, b.x) })
		out = append(out, series{rank: rank, points: kept})
	}
	slices.SortFunc(out, func(a, b series) int { return cmp.Compare(a.rank, b.rank) })
	return out
}
