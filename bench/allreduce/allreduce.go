// Package allreduce is the engine of `gradsync bench allreduce`: it
// times ring all-reduce the way nccl-tests and the gloo anchor script do,
// either over gRPC between N rank processes on loopback or over the
// in-memory ring in one process.
//
// # Processes and rendezvous
//
// RunParent picks N free loopback ports, starts N copies of the calling
// executable (a hidden subcommand the caller names through childArgs; the
// flags come from ChildArgs) and collects their results. Each child
// (RunChild, with options from ParseChildArgs) serves its Collective
// endpoint on its port, joins the ring (Join waits until both neighbours
// are linked) and passes a barrier before timing anything.
//
// # What is measured
//
// For each size: Warmup untimed all-reduces, then Reps repetitions of
// barrier + one timed all-reduce of size bytes of float32. A rep's time is
// the slowest rank's; the reported time is the median over reps. algbw =
// size/time, busbw = algbw·2(n−1)/n (GB/s, 1e9 bytes). The result of the
// first timed rep is checked on every rank.
package allreduce

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/aggregator/shmring"
	"github.com/gradsync/gradsync/internal/rpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Transports.
const (
	TransportGRPC = "grpc"
	TransportMem  = "mem"
	TransportSHM  = "shm"
	// TransportAuto: shared memory where the ranks' negotiation succeeds
	// (every rank on one host), gRPC otherwise; each result line names
	// the data plane the ranks really ran on, and rank 0 says why on
	// stderr.
	TransportAuto = "auto"
	// TransportSHMPairs: ranks as goroutines of this process (as in
	// `gradsync local`), every pair of ranks linked by a two-rank
	// shared-memory ring (aggregator.NewPairPeers over shmring), so that
	// every algorithm runs over shared memory.
	TransportSHMPairs = "shm-pairs"
)

// Options are the parameters shared by parent and children.
type Options struct {
	// Ranks is the world size n (>= 1).
	Ranks int
	// Sizes are the buffer sizes in bytes (multiples of 4).
	Sizes []int64
	// Reps timed repetitions per size (default 15), after Warmup untimed
	// ones (default 3).
	Reps, Warmup int
	// FrameElems is aggregator.Options.MaxFrameElems (0: its default).
	FrameElems int
	// InboxFrames and OutboxFrames tune the gRPC ring (0: defaults).
	InboxFrames, OutboxFrames int
	// SharedMemory: the rank processes, once their gRPC ring formed,
	// move it to shared memory (shmring.Negotiate), as ring jobs with
	// collective.transport shm do; a ring that cannot is an error here
	// unless FallBack.
	SharedMemory bool
	// FallBack (TransportAuto): a ring that cannot move to shared memory
	// stays on gRPC, and says why.
	FallBack bool
	// Algorithms are timed interleaved, each on its own lines; empty
	// means the ring alone. See the package documentation.
	Algorithms []aggregator.Algorithm
	// Calibrate (mem, shm-pairs): fit the cost model to probe messages
	// between ranks 0 and 1 (aggregator.Calibrate) instead of taking the
	// transport's constants; Model reports the model used.
	Calibrate bool
}

// algorithms returns o.Algorithms, or the ring alone.
func (o Options) algorithms() []aggregator.Algorithm {
	if len(o.Algorithms) == 0 {
		return []aggregator.Algorithm{aggregator.AlgoRing}
	}
	return o.Algorithms
}

// ringOnly reports whether every algorithm asked for is the ring.
func (o Options) ringOnly() bool {
	for _, a := range o.algorithms() {
		if a != aggregator.AlgoRing {
			return false
		}
	}
	return true
}

// ParseAlgorithms parses a comma-separated list of aggregator.AlgorithmNames.
func ParseAlgorithms(s string) ([]aggregator.Algorithm, error) {
	var out []aggregator.Algorithm
	for f := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(f) == "" {
			return nil, fmt.Errorf("allreduce: --algorithm %q: empty name; allowed: %s", s, strings.Join(aggregator.AlgorithmNames, ", "))
		}
		a, err := aggregator.ParseAlgorithm(f)
		if err != nil {
			return nil, fmt.Errorf("allreduce: --algorithm: %w", err)
		}
		if slices.Contains(out, a) {
			return nil, fmt.Errorf("allreduce: --algorithm: %v given twice", a)
		}
		out = append(out, a)
	}
	return out, nil
}

// CostModel returns the cost model the algorithm choice uses on
// transport. The in-process transports' ranks share this process's
// cores (runtime.GOMAXPROCS).
func CostModel(transport string) aggregator.CostModel {
	switch transport {
	case TransportMem:
		m := aggregator.CostMem
		m.Cores = runtime.GOMAXPROCS(0)
		return m
	case TransportSHMPairs:
		m := aggregator.CostSHM
		m.Cores = runtime.GOMAXPROCS(0)
		return m
	case TransportSHM:
		return aggregator.CostSHM
	}
	return aggregator.CostGRPC
}

func (o Options) withDefaults() Options {
	if o.Reps == 0 {
		o.Reps = 15
	}
	if o.Warmup == 0 {
		o.Warmup = 3
	}
	return o
}

// Validate reports whether o is usable.
func (o Options) Validate() error {
	switch {
	case o.Ranks < 1 || o.Ranks > 64:
		return fmt.Errorf("allreduce: ranks %d out of range 1..64", o.Ranks)
	case len(o.Sizes) == 0:
		return errors.New("allreduce: no sizes given")
	case o.Reps < 0 || o.Warmup < 0:
		return fmt.Errorf("allreduce: reps %d and warmup %d must not be negative", o.Reps, o.Warmup)
	}
	for _, s := range o.Sizes {
		if s <= 0 || s%4 != 0 || s > 4<<30 {
			return fmt.Errorf("allreduce: size %d bytes: want a positive multiple of 4 up to 4 GiB", s)
		}
	}
	return (aggregator.Options{MaxFrameElems: o.FrameElems}).Validate()
}

// Result is one line of the report: nccl-tests columns for one size.
type Result struct {
	Transport string `json:"transport"`
	// Algorithm is the algorithm asked for; Ran the one that ran (the
	// model's pick when Algorithm is auto).
	Algorithm string `json:"algorithm"`
	Ran       string `json:"ran"`
	// ModelPick is the transport's cost model's pick for this size and
	// world, and ModelMS its estimate for Ran, in milliseconds.
	ModelPick string  `json:"model_pick"`
	ModelMS   float64 `json:"model_ms"`
	// ModelAlphaUS and ModelBetaUSKiB are the cost model's α (µs) and β
	// (µs per KiB), and
	// Estimates its estimate of every algorithm (ms).
	ModelAlphaUS   float64            `json:"model_alpha_us"`
	ModelBetaUSKiB float64            `json:"model_beta_us_per_kib"`
	ModelCores     int                `json:"model_cores"`
	Estimates      map[string]float64 `json:"model_estimates_ms"`
	Ranks          int                `json:"ranks"`
	SizeBytes      int64              `json:"size_bytes"`
	Elements       int64              `json:"elements"`
	Reps           int                `json:"reps"`
	TimeMS         float64            `json:"time_ms"` // median over reps of the slowest rank
	MinMS          float64            `json:"min_ms"`
	MaxMS          float64            `json:"max_ms"`
	AlgBW          float64            `json:"algbw_gbs"` // size / time, GB/s
	BusBW          float64            `json:"busbw_gbs"` // algbw · 2(n−1)/n
}

// rankTimes is what a child prints per size: its own time of each rep.
type rankTimes struct {
	Rank      int     `json:"rank"`
	SizeBytes int64   `json:"size_bytes"`
	Algorithm string  `json:"algorithm,omitempty"` // as asked; "" is the ring
	TimesNS   []int64 `json:"times_ns"`
	// Transport is the data plane the rank's ring really ran on, so the
	// parent can refuse a table whose label does not match it.
	Transport string `json:"transport,omitempty"`
}

// summarize turns per-rep slowest-rank times into a Result.
func summarize(transport string, n int, size int64, slowest []time.Duration) Result {
	s := slices.Clone(slowest)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	r := Result{Transport: transport, Ranks: n, SizeBytes: size, Elements: size / 4, Reps: len(s),
		TimeMS: ms(med), MinMS: ms(s[0]), MaxMS: ms(s[len(s)-1])}
	if med > 0 {
		r.AlgBW = float64(size) / med.Seconds() / 1e9
		r.BusBW = r.AlgBW * 2 * float64(n-1) / float64(n)
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// ParseSizes parses "1M,4M,16M,64M": byte counts with an optional K, M or
// G suffix (binary: KiB, MiB, GiB).
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		mult := int64(1)
		switch {
		case strings.HasSuffix(strings.ToUpper(f), "K"):
			mult = 1 << 10
		case strings.HasSuffix(strings.ToUpper(f), "M"):
			mult = 1 << 20
		case strings.HasSuffix(strings.ToUpper(f), "G"):
			mult = 1 << 30
		}
		if mult > 1 {
			f = f[:len(f)-1]
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("allreduce: size %q: want a positive number with an optional K, M or G suffix", f)
		}
		out = append(out, v*mult)
	}
	return out, nil
}

// fill sets rank r's input: (r+1)·(i mod 7 + 1), small integers whose sum
// is exact; check verifies the sum n(n+1)/2·(i mod 7 + 1) at a few places.
func fill(buf []float32, r int) {
	for i := range buf {
		buf[i] = float32((r + 1) * (i%7 + 1))
	}
}

func check(buf []float32, n int) error {
	tri := n * (n + 1) / 2
	for _, i := range []int{0, len(buf) / 3, len(buf) / 2, len(buf) - 1} {
		if want := float32(tri * (i%7 + 1)); buf[i] != want {
			return fmt.Errorf("allreduce: wrong sum: buf[%d] = %v, want %v", i, buf[i], want)
		}
	}
	return nil
}

// runRank runs the whole benchmark on one rank of ring r and reports each
// size's per-rep times to emit.
func runRank(ctx context.Context, r aggregator.Ring, o Options, emit func(rankTimes) error) error {
	n := r.Size()
	opt := aggregator.Options{MaxFrameElems: o.FrameElems}
	if g, ok := r.(interface{ Generation() uint64 }); ok {
		opt.Generation = g.Generation()
	}
	step := int64(0)
	next := func() int64 { step++; return step }
	if err := aggregator.Barrier(ctx, r, next(), opt); err != nil {
		return err
	}
	for _, size := range o.Sizes {
		buf := make([]float32, size/4)
		for range o.Warmup {
			if err := aggregator.AllReduce(ctx, r, buf, next(), opt); err != nil {
				return err
			}
		}
		times := make([]int64, o.Reps)
		for rep := range o.Reps {
			fill(buf, r.Rank()) // keeps values finite; untimed
			if err := aggregator.Barrier(ctx, r, next(), opt); err != nil {
				return err
			}
			start := time.Now()
			if err := aggregator.AllReduce(ctx, r, buf, next(), opt); err != nil {
				return err
			}
			times[rep] = time.Since(start).Nanoseconds()
			if rep == 0 {
				if err := check(buf, n); err != nil {
					return err
				}
			}
		}
		if err := emit(rankTimes{Rank: r.Rank(), SizeBytes: size, TimesNS: times}); err != nil {
			return err
		}
	}
	return aggregator.Barrier(ctx, r, next(), opt)
}

// RunMem runs the benchmark with o.Ranks in-memory ranks in this process.
func RunMem(ctx context.Context, o Options) ([]Result, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if !o.ringOnly() || o.Calibrate {
		return runPeers(ctx, TransportMem, o, aggregator.NewMemPeers(o.Ranks, 4))
	}
	rings := aggregator.NewMemRing(o.Ranks, 4)
	defer func() {
		for _, r := range rings {
			r.(io.Closer).Close()
		}
	}()
	per := make([][]rankTimes, o.Ranks)
	errs := make([]error, o.Ranks)
	var wg sync.WaitGroup
	for i, r := range rings {
		wg.Go(func() {
			errs[i] = runRank(ctx, r, o, func(t rankTimes) error { per[i] = append(per[i], t); return nil })
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return collect(TransportMem, o, CostModel(TransportMem), slices.Concat(per...))
}

// runPeers runs the benchmark with one goroutine per rank of ps, which it
// closes before returning.
func runPeers(ctx context.Context, transport string, o Options, ps []aggregator.Peers) ([]Result, error) {
	defer func() {
		for _, p := range ps {
			if c, ok := p.(io.Closer); ok {
				c.Close()
			}
		}
	}()
	models := make([]aggregator.CostModel, o.Ranks)
	per := make([][]rankTimes, o.Ranks)
	errs := make([]error, o.Ranks)
	var wg sync.WaitGroup
	for i, p := range ps {
		models[i] = CostModel(transport)
		wg.Go(func() {
			errs[i] = runPeersRank(ctx, p, o, &models[i], func(t rankTimes) error { per[i] = append(per[i], t); return nil })
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return collect(transport, o, models[0], slices.Concat(per...))
}

// runPeersRank runs the whole benchmark on one rank of p, every algorithm
// of o interleaved rep by rep, and reports each (size, algorithm)'s
// per-rep times to emit.
// With o.Calibrate it first replaces *model with the calibrated one.
func runPeersRank(ctx context.Context, p aggregator.Peers, o Options, model *aggregator.CostModel, emit func(rankTimes) error) error {
	n := p.Size()
	ring := aggregator.PeerRing(p)
	opt := aggregator.Options{MaxFrameElems: o.FrameElems}
	step := int64(0)
	next := func() int64 { step++; return step }
	if err := aggregator.Barrier(ctx, ring, next(), opt); err != nil {
		return err
	}
	if o.Calibrate {
		m, err := aggregator.Calibrate(ctx, p, next(), opt, nil, *model)
		if err != nil {
			return err
		}
		next() // Calibrate used two steps
		*model = m
	}
	asked := o.algorithms()
	for _, size := range o.Sizes {
		buf := make([]float32, size/4)
		run := make([]aggregator.Algorithm, len(asked))
		for i, a := range asked {
			run[i] = a
			if a == aggregator.AlgoAuto {
				run[i], _ = model.Choose(n, len(buf), o.FrameElems)
			}
		}
		for range o.Warmup {
			for _, a := range run {
				if err := aggregator.AllReduceWith(ctx, p, a, buf, next(), opt); err != nil {
					return err
				}
			}
		}
		times := make([][]int64, len(run))
		for i := range times {
			times[i] = make([]int64, o.Reps)
		}
		for rep := range o.Reps {
			for i, a := range run {
				fill(buf, p.Rank()) // keeps values finite; untimed
				if err := aggregator.Barrier(ctx, ring, next(), opt); err != nil {
					return err
				}
				start := time.Now()
				if err := aggregator.AllReduceWith(ctx, p, a, buf, next(), opt); err != nil {
					return err
				}
				times[i][rep] = time.Since(start).Nanoseconds()
				if rep == 0 {
					if err := check(buf, n); err != nil {
						return fmt.Errorf("%v: %w", a, err)
					}
				}
			}
		}
		for i, a := range asked {
			if err := emit(rankTimes{Rank: p.Rank(), SizeBytes: size, Algorithm: a.String(), TimesNS: times[i]}); err != nil {
				return err
			}
		}
	}
	return aggregator.Barrier(ctx, ring, next(), opt)
}

// collect combines every rank's times into one Result per size and
// algorithm; model is the cost model the ranks used.
func collect(transport string, o Options, model aggregator.CostModel, all []rankTimes) ([]Result, error) {
	var out []Result
	for _, size := range o.Sizes {
		for _, algo := range o.algorithms() {
			r, err := collectOne(transport, o, all, size, algo)
			if err != nil {
				return nil, err
			}
			elems := int(size / 4)
			pick, est := model.Choose(o.Ranks, elems, o.FrameElems)
			ran := algo
			if algo == aggregator.AlgoAuto {
				ran = pick
			}
			r.Algorithm, r.Ran, r.ModelPick = algo.String(), ran.String(), pick.String()
			r.ModelAlphaUS = float64(model.Alpha.Nanoseconds()) / 1e3
			r.ModelBetaUSKiB = float64(model.Beta.Nanoseconds()) / 1e3
			r.ModelCores = model.Cores
			r.Estimates = make(map[string]float64, len(est))
			for _, e := range est {
				r.Estimates[e.Algo.String()] = ms(e.Time)
				if e.Algo == ran {
					r.ModelMS = ms(e.Time)
				}
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func collectOne(transport string, o Options, all []rankTimes, size int64, algo aggregator.Algorithm) (Result, error) {
	slowest := make([]time.Duration, o.Reps)
	seen := 0
	ran := transport // "" (auto): the first rank's plane, which every other must match
	for _, t := range all {
		if t.SizeBytes != size || (t.Algorithm != algo.String() && (t.Algorithm != "" || algo != aggregator.AlgoRing)) {
			continue
		}
		if len(t.TimesNS) != o.Reps {
			return Result{}, fmt.Errorf("allreduce: rank %d reported %d reps for %d bytes, want %d", t.Rank, len(t.TimesNS), size, o.Reps)
		}
		if ran == "" {
			ran = t.Transport
		}
		if t.Transport != "" && t.Transport != ran {
			if transport == "" {
				return Result{}, fmt.Errorf("allreduce: rank %d ran on %s, another rank on %s", t.Rank, t.Transport, ran)
			}
			return Result{}, fmt.Errorf("allreduce: rank %d ran on %s, not on the %s asked for", t.Rank, t.Transport, transport)
		}
		seen++
		for i, ns := range t.TimesNS {
			slowest[i] = max(slowest[i], time.Duration(ns))
		}
	}
	if seen != o.Ranks {
		return Result{}, fmt.Errorf("allreduce: %d of %d ranks reported %v results for %d bytes", seen, o.Ranks, algo, size)
	}
	return summarize(ran, o.Ranks, size, slowest), nil
}

// ChildOptions configure one rank process.
type ChildOptions struct {
	Options
	// Rank is this process's rank; Peers the loopback address of every
	// rank's Collective endpoint, this one's included (it listens there).
	Rank  int
	Peers []string
	// Out receives the results as JSON lines (default os.Stdout).
	Out io.Writer
	// Log receives diagnostics (default: discarded).
	Log *slog.Logger
}

// ChildArgs renders the flags that ParseChildArgs reads.
func ChildArgs(o Options, rank int, peers []string) []string {
	sizes := make([]string, len(o.Sizes))
	for i, s := range o.Sizes {
		sizes[i] = strconv.FormatInt(s, 10)
	}
	return []string{
		"--rank", strconv.Itoa(rank), "--peers", strings.Join(peers, ","),
		"--sizes", strings.Join(sizes, ","), "--reps", strconv.Itoa(o.Reps), "--warmup", strconv.Itoa(o.Warmup),
		"--frame-elems", strconv.Itoa(o.FrameElems),
		"--inbox-frames", strconv.Itoa(o.InboxFrames), "--outbox-frames", strconv.Itoa(o.OutboxFrames),
		"--shm=" + strconv.FormatBool(o.SharedMemory), "--fallback=" + strconv.FormatBool(o.FallBack),
	}
}

// ParseChildArgs parses ChildArgs's flags (for a hidden subcommand with
// flag parsing disabled).
func ParseChildArgs(args []string) (ChildOptions, error) {
	var c ChildOptions
	fs := flag.NewFlagSet("allreduce-child", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var peers, sizes string
	fs.IntVar(&c.Rank, "rank", -1, "")
	fs.StringVar(&peers, "peers", "", "")
	fs.StringVar(&sizes, "sizes", "", "")
	fs.IntVar(&c.Reps, "reps", 15, "")
	fs.IntVar(&c.Warmup, "warmup", 3, "")
	fs.IntVar(&c.FrameElems, "frame-elems", 0, "")
	fs.IntVar(&c.InboxFrames, "inbox-frames", 0, "")
	fs.IntVar(&c.OutboxFrames, "outbox-frames", 0, "")
	fs.BoolVar(&c.SharedMemory, "shm", false, "")
	fs.BoolVar(&c.FallBack, "fallback", false, "")
	if err := fs.Parse(args); err != nil {
		return c, fmt.Errorf("allreduce: child flags: %w", err)
	}
	c.Peers = strings.Split(peers, ",")
	c.Ranks = len(c.Peers)
	var err error
	if c.Sizes, err = ParseSizes(sizes); err != nil {
		return c, err
	}
	if c.Rank < 0 || c.Rank >= c.Ranks {
		return c, fmt.Errorf("allreduce: child --rank %d out of range for %d peers", c.Rank, c.Ranks)
	}
	return c, c.Validate()
}

// RunChild runs one rank process: it serves its Collective endpoint on
// Peers[Rank], joins the ring, runs the benchmark and prints its times.
func RunChild(ctx context.Context, c ChildOptions) error {
	c.Options = c.withDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", c.Peers[c.Rank])
	if err != nil {
		return fmt.Errorf("allreduce: rank %d: %w", c.Rank, err)
	}
	ep := ringrpc.NewEndpoint(c.Log)
	defer ep.Close()
	gs := grpc.NewServer(append(rpc.ServerOptions(c.Log, nil, nil), ringrpc.ServerOptions()...)...)
	pb.RegisterCollectiveServer(gs, ep)
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(lis) })
	defer func() {
		// Graceful: the last acknowledgements of the neighbours' streams
		// must reach them before this process exits.
		t := time.AfterFunc(5*time.Second, gs.Stop)
		gs.GracefulStop()
		t.Stop()
		wg.Wait()
	}()

	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ring, err := ep.Join(jctx, ringrpc.RingConfig{
		JobID: "bench-allreduce", Generation: 1, Rank: c.Rank, Peers: c.Peers,
		InboxFrames: c.InboxFrames, OutboxFrames: c.OutboxFrames,
	})
	if err != nil {
		return err
	}
	defer ring.Close()
	var data aggregator.Ring = ring
	if c.SharedMemory {
		shm, why, err := shmring.Negotiate(jctx, ring, shmring.Config{JobID: "bench-allreduce", Generation: 1, MaxFrameElems: c.FrameElems, Log: c.Log},
			aggregator.Options{Generation: 1, MaxFrameElems: c.FrameElems})
		if err != nil {
			return err
		}
		switch {
		case shm == nil && !c.FallBack:
			return fmt.Errorf("allreduce: rank %d: the ranks stay on gRPC: %s", c.Rank, why)
		case shm == nil:
			c.Log.Info("bench allreduce: collectives stay on gRPC", "rank", c.Rank, "why", why)
		default:
			c.Log.Info("bench allreduce: collectives over shared memory", "rank", c.Rank, "why", "every rank is on this host and linked its segments")
			defer shm.Close()
			data = shm
		}
	}
	enc := json.NewEncoder(c.Out)
	transport := TransportGRPC
	if _, ok := data.(*shmring.Ring); ok {
		transport = TransportSHM
	}
	if err := runRank(ctx, data, c.Options, func(t rankTimes) error { t.Transport = transport; return enc.Encode(t) }); err != nil {
		return err
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	return ring.Shutdown(sctx)
}

// ParentOptions configure RunParent.
type ParentOptions struct {
	Options
	// Transport is TransportGRPC, TransportSHM or TransportAuto (N
	// processes) or TransportMem (one).
	Transport string
	// Env is added to each child's environment.
	Env []string
	// Stderr receives the children's stderr (default os.Stderr).
	Stderr io.Writer
}

// RunParent runs the benchmark. For TransportGRPC and TransportSHM it
// starts o.Ranks processes `exe prefix... ChildArgs(...)...`, which must
// call RunChild with the options ParseChildArgs returns; for TransportMem
// it runs RunMem. RunParent renders the children's flags itself, from the
// options it runs with (shared memory on for TransportSHM and
// TransportAuto), and refuses results that a child reports from another
// data plane than asked for (with TransportAuto: results whose ranks
// disagree); TransportAuto's results name the plane the ranks chose.
func RunParent(ctx context.Context, o ParentOptions, exe string, prefix []string) ([]Result, error) {
	o.Options = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	switch o.Transport {
	case TransportMem:
		return RunMem(ctx, o.Options)
	case TransportSHMPairs:
		return RunSHMPairs(ctx, o.Options)
	}
	if !o.ringOnly() {
		return nil, fmt.Errorf("allreduce: --algorithm %v: transport %q runs the ring only; halving_doubling, tree and auto run on %q and %q",
			o.algorithms(), o.Transport, TransportMem, TransportSHMPairs)
	}
	switch o.Transport {
	case TransportGRPC, "":
	case TransportSHM:
		o.SharedMemory = true
	case TransportAuto:
		o.SharedMemory, o.FallBack = true, true
	default:
		return nil, fmt.Errorf("allreduce: transport %q: want %q, %q, %q, %q or %q", o.Transport, TransportGRPC, TransportSHM, TransportAuto, TransportMem, TransportSHMPairs)
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	peers, err := freePorts(ctx, o.Ranks)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex // protects all
		all  []rankTimes
		wg   sync.WaitGroup
		errs = make([]error, o.Ranks)
	)
	for rank := range o.Ranks {
		cmd := exec.CommandContext(ctx, exe, append(slices.Clone(prefix), ChildArgs(o.Options, rank, peers)...)...)
		cmd.Env = append(os.Environ(), o.Env...)
		cmd.Stderr = o.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("allreduce: start rank %d: %w", rank, err)
		}
		wg.Go(func() { // owned by RunParent: reads rank's results, then reaps it
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var t rankTimes
				if json.Unmarshal(sc.Bytes(), &t) != nil || t.Rank != rank {
					continue // not a result line
				}
				mu.Lock()
				all = append(all, t)
				mu.Unlock()
			}
			if err := cmd.Wait(); err != nil {
				errs[rank] = fmt.Errorf("allreduce: rank %d: %w", rank, err)
				cancel() // one rank failed: the others cannot finish
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	transport := TransportGRPC
	switch {
	case o.FallBack:
		transport = "" // whichever the ranks agree on
	case o.SharedMemory:
		transport = TransportSHM
	}
	return collect(transport, o.Options, CostModel(transport), all)
}

// RunSHMPairs runs the benchmark with o.Ranks ranks as goroutines of this
// process, every pair linked by a two-rank shared-memory ring (made in
// shmring.DefaultDir, with a random job secret).
func RunSHMPairs(ctx context.Context, o Options) ([]Result, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	n := o.Ranks
	pairs := make([][]aggregator.Ring, n)
	for i := range pairs {
		pairs[i] = make([]aggregator.Ring, n)
	}
	closeAll := func() {
		for _, row := range pairs {
			for _, r := range row {
				if r != nil {
					r.(io.Closer).Close()
				}
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := range n {
		for j := i + 1; j < n; j++ {
			rs, err := shmPair(cctx, fmt.Sprintf("bench-allreduce/pair-%d-%d", i, j), secret, o.FrameElems)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("allreduce: shared-memory pair %d-%d: %w", i, j, err)
			}
			pairs[i][j], pairs[j][i] = rs[0], rs[1]
		}
	}
	ps := make([]aggregator.Peers, n)
	for i := range n {
		ps[i] = aggregator.NewPairPeers(i, pairs[i])
	}
	return runPeers(ctx, TransportSHMPairs, o, ps) // closes ps, and so every pair
}

// shmPair sets up a two-rank shared-memory ring in this process.
func shmPair(ctx context.Context, job string, secret []byte, frameElems int) ([2]*shmring.Ring, error) {
	var rs [2]*shmring.Ring
	var ps [2]*shmring.Pending
	var offers [2]shmring.Offer
	for i := range 2 {
		p, o, err := shmring.Create(shmring.Config{JobID: job, Generation: 1, Rank: i, Size: 2, Secret: secret, MaxFrameElems: frameElems})
		if err != nil {
			if ps[0] != nil {
				ps[0].Close()
			}
			return rs, err
		}
		ps[i], offers[i] = p, o
	}
	var errs [2]error
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { rs[i], errs[i] = ps[i].Connect(ctx, offers[1-i]) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		for _, r := range rs {
			if r != nil {
				r.Close()
			}
		}
		return [2]*shmring.Ring{}, err
	}
	return rs, nil
}

// freePorts reserves n loopback ports by listening on port 0, and frees
// them for the children to take.
func freePorts(ctx context.Context, n int) ([]string, error) {
	var lc net.ListenConfig
	addrs := make([]string, n)
	for i := range addrs {
		l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("allreduce: pick a port: %w", err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// WriteTable prints results in nccl-tests columns.
func WriteTable(w io.Writer, rs []Result) error {
	if _, err := fmt.Fprintf(w, "%-9s %-16s %5s %12s %10s %10s %10s %10s %10s %-16s %10s\n",
		"transport", "algorithm", "ranks", "size(B)", "time(ms)", "min(ms)", "max(ms)", "algbw", "busbw", "model pick", "model(ms)"); err != nil {
		return err
	}
	for _, r := range rs {
		algo := r.Ran
		if r.Algorithm != r.Ran {
			algo = r.Algorithm + ":" + r.Ran
		}
		if _, err := fmt.Fprintf(w, "%-9s %-16s %5d %12d %10.3f %10.3f %10.3f %10.3f %10.3f %-16s %10.3f\n",
			r.Transport, algo, r.Ranks, r.SizeBytes, r.TimeMS, r.MinMS, r.MaxMS, r.AlgBW, r.BusBW, r.ModelPick, r.ModelMS); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints one JSON object per result.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
