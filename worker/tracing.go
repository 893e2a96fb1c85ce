package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// tracePath is where a task's trace goes: path with "-rankR" (and "-gN"
// after the first generation) before its extension.
func tracePath(path string, a *pb.Assignment) string {
	ext := filepath.Ext(path)
	tag := fmt.Sprintf("-rank%d", a.Rank)
	if a.Generation > 1 {
		tag = fmt.Sprintf("-g%d%s", a.Generation, tag)
	}
	return strings.TrimSuffix(path, ext) + tag + ext
}

// writeTrace writes the task's timeline as a Chrome trace (the worker's
// log says where, or why not).
func (w *Worker) writeTrace(rec *trace.Recorder, a *pb.Assignment, res *pb.JobResult) {
	path := tracePath(w.cfg.TracePath, a)
	meta := map[string]string{"job": a.JobId, "generation": fmt.Sprint(a.Generation), "rank": fmt.Sprint(a.Rank),
		"world": fmt.Sprint(a.WorldSize), "model": a.Spec.GetModel(), "worker": w.cfg.ID}
	if res != nil {
		meta["comm_overlap_ratio"] = fmt.Sprintf("%.4f", res.CommOverlapRatio)
	}
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	var f *os.File
	if err == nil {
		f, err = os.Create(path)
	}
	if err == nil {
		err = rec.WriteChrome(f, int(a.Rank), fmt.Sprintf("rank %d (%s)", a.Rank, w.cfg.ID), meta)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		w.log.Warn("trace not written", "job", a.JobId, "rank", a.Rank, "path", path, "err", err)
		return
	}
	w.log.Info("trace written", "job", a.JobId, "rank", a.Rank, "path", path)
}

// layerTrace turns the gradient-ready notifications of a backward pass
// into one span per layer: the time between a layer's gradients becoming
// final and the previous notification is that layer's backward.
//
// Forward is recorded per layer too, through the network's forward hook
// (one thread, no activation checkpointing; else as one span).
type layerTrace struct {
	rec   *trace.Recorder
	offs  []int    // the parameter segments' offsets, ascending
	names []string // their layers' names (conv1 for conv1.weight)
	kinds []string // the layers' kinds in Forward's order
	fwd   time.Time
}

func newLayerTrace(rec *trace.Recorder, net *models.Network) *layerTrace {
	lt := &layerTrace{rec: rec, kinds: net.LayerKinds()}
	net.SetForwardHook(lt.forward)
	for _, s := range net.Segments() {
		name := s.Name
		if i := strings.LastIndexByte(name, '.'); i > 0 {
			name = name[:i]
		}
		lt.offs, lt.names = append(lt.offs, s.Offset), append(lt.names, name)
	}
	return lt
}

// forward records layer i's Forward as a span.
func (lt *layerTrace) forward(i int, done bool) {
	if !done {
		lt.fwd = time.Now()
		return
	}
	lt.rec.Span(fmt.Sprintf("forward %d %s", i, lt.kinds[i]), trace.CatForward, trace.TidCompute, lt.fwd, time.Now(), nil)
}

// layer names the layer whose parameters start at or before offset from.
func (lt *layerTrace) layer(from int) string {
	i, found := slices.BinarySearch(lt.offs, from)
	if !found {
		i--
	}
	if i < 0 || i >= len(lt.names) {
		return "input"
	}
	return lt.names[i]
}

// backward wraps ready (which may be nil) so that each notification
// closes the span of the layer that just finished, starting at start.
func (lt *layerTrace) backward(start time.Time, ready func(from int)) func(from int) {
	last, lastFrom := start, -1
	return func(from int) {
		if from != lastFrom {
			now := time.Now()
			lt.rec.Span("backward "+lt.layer(from), trace.CatBackward, trace.TidCompute, last, now, nil)
			last, lastFrom = now, from
		}
		if ready != nil {
			ready(from)
		}
	}
}

// overlapRatio is the share of the recorded all-reduce time that ran
// while backward was computing (0 when none was recorded).
func overlapRatio(rec *trace.Recorder) float64 {
	events, _ := rec.Events()
	ov, total := trace.Overlap(events, trace.CatComm, trace.CatBackward)
	if total == 0 {
		return 0
	}
	return ov / total
}
