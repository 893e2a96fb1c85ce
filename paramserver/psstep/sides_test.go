package psstep_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// record is an optimiser that keeps the averaged gradients it is given.
type record struct{ grads [][]float32 }

func (r *record) Step(_, grads []float32) { r.grads = append(r.grads, slices.Clone(grads)) }

// flatSegs is one vector of n elements.
func flatSegs(n int) []models.Segment {
	return []models.Segment{{Name: "w", Shape: []int{n}, Len: n}}
}

// pushPieces pushes every rank's message (msgs[r]) of phase ph into s
// in pieces of at most piece elements, the ranks' pieces interleaved,
// and returns the outcome of each call in order.
func pushPieces(t *testing.T, s *psstep.Shard, step int64, ph compress.PSPhase, msgs [][]float32, piece int) []psstep.Outcome {
	t.Helper()
	var outs []psstep.Outcome
	for off := 0; ; off += piece {
		more := false
		for r, m := range msgs {
			if off >= len(m) && !(off == 0 && len(m) == 0) {
				continue
			}
			end := min(off+piece, len(m))
			more = more || end < len(m)
			out, err := s.Add(r, step, ph, off, end-off, func(dst []float32) error {
				for i, v := range m[off:end] {
					dst[i] += v
				}
				return nil
			})
			if err != nil {
				t.Fatalf("rank %d piece at %d: %v", r, off, err)
			}
			outs = append(outs, out)
		}
		if !more {
			return outs
		}
	}
}

// TestShardAverages: for world sizes 1–4 and lengths 0, 1, n−1, n,
// n+1 and odd ones, the averaged gradient the shard applies is the sum
// of the ranks' (rank-valued, so the sum is exact) times 1/n, as
// aggregator's cores average; only the last piece of the last rank
// completes the step, which then moves on.
func TestShardAverages(t *testing.T) {
	for world := 1; world <= 4; world++ {
		for _, n := range []int{0, 1, world - 1, world, world + 1, 7, 13} {
			if n < 0 {
				continue
			}
			t.Run(fmt.Sprintf("world%d/len%d", world, n), func(t *testing.T) {
				rec := &record{}
				core := aggregator.NewSyncShard(make([]float32, n), world, rec, false)
				recv, err := compress.NewPSReceiver(scheme(t, nil, 0), flatSegs(n), world)
				if err != nil {
					t.Fatal(err)
				}
				s := psstep.NewShard(core, recv)
				for step := range int64(2) {
					msgs := make([][]float32, world)
					want := make([]float32, n)
					for r := range msgs {
						msgs[r] = make([]float32, n)
						for i := range msgs[r] {
							msgs[r][i] = float32((r+1)*(i+1)) + float32(step)
							want[i] += msgs[r][i]
						}
					}
					for i := range want {
						want[i] *= 1 / float32(world)
					}
					ph := recv.Phases(step)[0]
					outs := pushPieces(t, s, step, ph, msgs, 3)
					for i, o := range outs {
						last := i == len(outs)-1
						if o.Applied != last || o.Combined != last {
							t.Fatalf("step %d: call %d of %d: outcome %+v", step, i, len(outs), o)
						}
					}
					if got := rec.grads[len(rec.grads)-1]; !slices.Equal(got, want) {
						t.Fatalf("step %d: applied %v, want %v", step, got, want)
					}
					if core.Step() != step+1 {
						t.Fatalf("after step %d the shard is at %d", step, core.Step())
					}
				}
				// A push for a step the shard has passed is stale.
				_, err = s.Add(0, 0, recv.Phases(0)[0], 0, n, func([]float32) error { return nil })
				if _, ok := err.(*aggregator.StaleError); !ok {
					t.Errorf("a push for step 0 at step 2: %v, want a StaleError", err)
				}
			})
		}
	}
}

// naiveOrth orthonormalises the columns of a (rows×r, row-major) by
// classical Gram–Schmidt in float64.
func naiveOrth(a []float32, rows, r int) []float64 {
	out := make([]float64, len(a))
	for i, v := range a {
		out[i] = float64(v)
	}
	for k := range r {
		for j := range k {
			var dot float64
			for i := range rows {
				dot += out[i*r+j] * out[i*r+k]
			}
			for i := range rows {
				out[i*r+k] -= dot * out[i*r+j]
			}
		}
		var ss float64
		for i := range rows {
			ss += out[i*r+k] * out[i*r+k]
		}
		for i := range rows {
			out[i*r+k] /= math.Sqrt(ss)
		}
	}
	return out
}

// TestShardPowerSGD: the shard's PowerSGD reductions against naive
// ones, for n ranks: P answered after phase 1 is the orthonormalised
// ΣP_i; the Q answered after phase 2 is ΣQ_i/n; the gradient applied is
// P·Qᵀ for the matrix and the averaged bias; the shard answers
// Factors, SharedQ and Params with them.
func TestShardPowerSGD(t *testing.T) {
	const rows, cols, r = 32, 24, 2
	spec := &pb.CompressionSpec{Type: "powersgd", Rank: r, StartIter: -1}
	for _, world := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("world%d", world), func(t *testing.T) {
			rec := &record{}
			core := aggregator.NewSyncShard(make([]float32, total), world, rec, false)
			recv, err := compress.NewPSReceiver(scheme(t, spec, 0), segs, world)
			if err != nil {
				t.Fatal(err)
			}
			s := psstep.NewShard(core, recv)
			phases := recv.Phases(0)
			if len(phases) != 2 || phases[0].Total != rows*r+32 || phases[1].Total != cols*r {
				t.Fatalf("phases %+v", phases)
			}
			// Phase 1: P_i (rows×r) then the bias (32 values).
			p1 := make([][]float32, world)
			sumP := make([]float32, phases[0].Total)
			for k := range p1 {
				p1[k] = make([]float32, phases[0].Total)
				for i := range p1[k] {
					p1[k][i] = float32(math.Sin(float64(1+i*(k+2)))) * float32(k+1)
					sumP[i] += p1[k][i]
				}
			}
			outs := pushPieces(t, s, 0, phases[0], p1, 10)
			if o := outs[len(outs)-1]; !o.Combined || o.Applied {
				t.Fatalf("phase 1's last piece: %+v", o)
			}
			pm := slices.Clone(s.Answer(psstep.Exchange{Kind: psstep.Factors, Step: 0, Phase: 1}))
			ref := naiveOrth(sumP[:rows*r], rows, r)
			for i, v := range pm {
				if math.Abs(float64(v)-ref[i]) > 1e-5 {
					t.Fatalf("P[%d] = %v, want %v", i, v, ref[i])
				}
			}
			// Phase 2: Q_i (cols×r).
			q2 := make([][]float32, world)
			wantQ := make([]float32, cols*r)
			for k := range q2 {
				q2[k] = make([]float32, cols*r)
				for i := range q2[k] {
					q2[k][i] = float32((i%5)-2) * float32(k+1) / 4
					wantQ[i] += q2[k][i]
				}
			}
			for i := range wantQ {
				wantQ[i] *= 1 / float32(world)
			}
			outs = pushPieces(t, s, 0, phases[1], q2, 7)
			if o := outs[len(outs)-1]; !o.Combined || !o.Applied {
				t.Fatalf("phase 2's last piece: %+v", o)
			}
			if got := s.Answer(psstep.Exchange{Kind: psstep.SharedQ, Step: 1, Phase: 2}); !slices.Equal(got, wantQ) {
				t.Fatalf("Q %v, want %v", got, wantQ)
			}
			want := make([]float32, total)
			for i := range rows {
				for j := range cols {
					var acc float64
					for k := range r {
						acc += float64(pm[i*r+k]) * float64(wantQ[j*r+k])
					}
					want[i*cols+j] = float32(acc)
				}
			}
			for i := range 32 {
				var b float32
				for k := range p1 {
					b += p1[k][rows*r+i]
				}
				want[rows*cols+i] = b * (1 / float32(world))
			}
			if len(rec.grads) != 1 || !slices.Equal(rec.grads[0], want) {
				t.Fatalf("applied %v\nwant %v", rec.grads, want)
			}
			if got := s.Answer(psstep.Exchange{Kind: psstep.Params, Step: 1}); &got[0] != &core.Params()[0] {
				t.Error("Params: want the shard's parameters")
			}
		})
	}
}

// TestCheckpointsDue: the decision after each step of scripted jobs
// (10 examples, 2 ranks of batch 2: 3 steps an epoch), as a script of
// step:decision for the steps that are due.
func TestCheckpointsDue(t *testing.T) {
	cases := []struct {
		name  string
		cs    *pb.CheckpointSpec
		start [3]int64 // step, epoch, consumed
		steps int64
		own   int
		since func(step int64) time.Duration
		want  string
	}{
		{"every 2 steps", &pb.CheckpointSpec{EverySteps: 2}, [3]int64{}, 9, 0, nil, "2:save 4:save 6:save 8:save"},
		{"every epoch", &pb.CheckpointSpec{EveryEpochs: 1}, [3]int64{}, 9, 0, nil, "3:save 6:save 9:save"},
		{"every 2 epochs", &pb.CheckpointSpec{EveryEpochs: 2}, [3]int64{}, 12, 0, nil, "6:save 12:save"},
		{"every epoch, error feedback", &pb.CheckpointSpec{EveryEpochs: 1}, [3]int64{}, 6, 48, nil, "3:gather 6:gather"},
		// Resumed after step 4 in epoch 1 with 4 positions consumed: 2
		// more steps end it.
		{"every epoch, resumed", &pb.CheckpointSpec{EveryEpochs: 1}, [3]int64{4, 1, 4}, 12, 0, nil, "6:save 9:save 12:save"},
		{"every 30 s", &pb.CheckpointSpec{EverySeconds: 30}, [3]int64{}, 6, 0,
			func(step int64) time.Duration { return time.Duration(step%3) * 15 * time.Second }, "2:save 5:save"},
		{"none", &pb.CheckpointSpec{}, [3]int64{}, 6, 0, nil, ""},
	}
	for _, c := range cases {
		spec := &pb.JobSpec{Checkpoint: c.cs}
		ck := psstep.Checkpoints{
			Policy: func(step int64, end bool, epoch int, since time.Duration) bool {
				return jobspec.CheckpointDue(spec, step, end, epoch, since)
			},
			World: 2, Batch: 2, TrainN: 10, StartStep: c.start[0], StartEpoch: int(c.start[1]), StartConsumed: c.start[2],
		}
		var got []string
		for step := c.start[0] + 1; step <= c.steps; step++ {
			var since time.Duration
			if c.since != nil {
				since = c.since(step)
			}
			if d := ck.Due(step, since, c.own); d != psstep.NotDue {
				got = append(got, fmt.Sprintf("%d:%v", step, d))
			}
		}
		if s := strings.Join(got, " "); s != c.want {
			t.Errorf("%s: %q, want %q", c.name, s, c.want)
		}
	}
	ck := psstep.Checkpoints{World: 2, Batch: 2, TrainN: 10, StartStep: 4, StartEpoch: 1, StartConsumed: 4}
	for _, w := range []struct {
		step     int64
		epoch    int
		consumed int64
		end      bool
	}{{4, 1, 4, false}, {5, 1, 8, false}, {6, 2, 0, true}, {7, 2, 4, false}, {9, 3, 0, true}} {
		e, c, end := ck.Position(w.step)
		if e != w.epoch || c != w.consumed || end != w.end {
			t.Errorf("Position(%d) = %d, %d, %v; want %d, %d, %v", w.step, e, c, end, w.epoch, w.consumed, w.end)
		}
	}
}

// TestLags: each rank's lag is measured from the first rank's arrival
// in the same step, and Take averages since the last Take.
func TestLags(t *testing.T) {
	var l psstep.Lags
	if _, ok := l.Take(0); ok {
		t.Error("Take before any step: want nothing")
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for step := range 2 {
		base := t0.Add(ms(1000 * step))
		l.Arrived(0, 3, base.Add(ms(5)), false)
		l.Arrived(2, 3, base, false)
		l.Arrived(1, 3, base.Add(ms(200+10*step)), true)
	}
	for rank, want := range []float64{0.005, 0.205, 0} {
		got, ok := l.Take(rank)
		if !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("rank %d: lag %v (%v); want %v", rank, got, ok, want)
		}
	}
	if _, ok := l.Take(1); ok {
		t.Error("Take right after Take: want nothing new")
	}
	if _, ok := l.Take(3); ok {
		t.Error("Take of a rank outside the world: want nothing")
	}
}

// TestStaleness: the receipts' sums, maxima and means; the wait of a
// step is its slowest shard's.
func TestStaleness(t *testing.T) {
	var s psstep.Staleness
	s.Note(nil) // consistency sync: no receipts
	if _, _, ok := s.Means(); ok || s.Steps != 1 {
		t.Fatalf("no receipts: %+v", s)
	}
	s.Note([]psstep.Receipt{{StaleSteps: 1, StaleUpdates: 3, WaitSeconds: 0.5}, {StaleSteps: 3, StaleUpdates: 1, Refused: true, WaitSeconds: 0.25}})
	s.Note([]psstep.Receipt{{StaleSteps: 2, StaleUpdates: 2, WaitSeconds: 1}})
	steps, updates, ok := s.Means()
	want := psstep.Staleness{Receipts: 3, StaleSteps: 6, StaleUpdates: 6, MaxSteps: 3, MaxUpdates: 3, Refused: 1, WaitSeconds: 1.5, Steps: 3}
	if !ok || steps != 2 || updates != 2 || s != want {
		t.Errorf("%+v, means %v %v %v; want %+v, 2 2", s, steps, updates, ok, want)
	}
}
