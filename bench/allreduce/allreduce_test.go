package allreduce

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gradsync/gradsync/aggregator"
)

// childEnv makes this test binary act as a rank process (the helper
// process pattern): TestMain runs RunChild instead of the tests.
const childEnv = "ALLREDUCEBENCH_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		c, err := ParseChildArgs(args)
		if p := os.Getenv("ALLREDUCEBENCH_CPUPROFILE"); p != "" && err == nil {
			f, ferr := os.Create(p + "." + strconv.Itoa(c.Rank))
			if ferr == nil {
				_ = pprof.StartCPUProfile(f)
				defer f.Close()
			}
		}
		if err == nil {
			err = RunChild(context.Background(), c)
		}
		pprof.StopCPUProfile()
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func runProcs(t *testing.T, o ParentOptions) []Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	o.Env = append(o.Env, childEnv+"=1")
	rs, err := RunParent(ctx, o, os.Args[0], []string{"-test.run=^$", "--"})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestProcesses(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		rs := runProcs(t, ParentOptions{Options: Options{Ranks: n, Sizes: []int64{4 << 10, 1 << 20}, Reps: 3, Warmup: 1}})
		if len(rs) != 2 || rs[1].SizeBytes != 1<<20 || rs[1].Ranks != n || rs[1].TimeMS <= 0 {
			t.Fatalf("n=%d: %+v", n, rs)
		}
	}
}

// TestProcessesSharedMemory: with TransportSHM the rank processes move
// their ring to shared memory and say so in their results (RunParent
// refuses results from another data plane than asked for: once the flag
// did not reach the children and "shm" rows were measured on gRPC).
func TestProcessesSharedMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared-memory rings are Linux-only")
	}
	for _, n := range []int{2, 3} {
		rs := runProcs(t, ParentOptions{Transport: TransportSHM, Options: Options{Ranks: n, Sizes: []int64{4 << 10, 1 << 20}, Reps: 3, Warmup: 1}})
		if len(rs) != 2 || rs[1].Transport != TransportSHM || rs[1].Ranks != n || rs[1].TimeMS <= 0 {
			t.Fatalf("n=%d: %+v", n, rs)
		}
	}
}

// TestCollectRefusesAnotherTransport: a rank that reports a data plane
// other than the one asked for fails the run.
func TestCollectRefusesAnotherTransport(t *testing.T) {
	o := Options{Ranks: 1, Sizes: []int64{4}, Reps: 1}
	if _, err := collect(TransportSHM, o, aggregator.CostSHM, []rankTimes{{Rank: 0, SizeBytes: 4, TimesNS: []int64{1}, Transport: TransportGRPC}}); err == nil {
		t.Fatal("a gRPC rank's times accepted as shm")
	}
	if _, err := collect(TransportSHM, o, aggregator.CostSHM, []rankTimes{{Rank: 0, SizeBytes: 4, TimesNS: []int64{1}, Transport: TransportSHM}}); err != nil {
		t.Fatal(err)
	}
}

// TestProcessesAuto: with TransportAuto, rank processes on one host
// negotiate shared memory and their results say so.
func TestProcessesAuto(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared-memory rings are Linux-only")
	}
	rs := runProcs(t, ParentOptions{Transport: TransportAuto, Options: Options{Ranks: 2, Sizes: []int64{4 << 10}, Reps: 3, Warmup: 1}})
	if len(rs) != 1 || rs[0].Transport != TransportSHM {
		t.Fatalf("%+v", rs)
	}
}

// TestCollectAuto: with TransportAuto the results name the data plane
// the ranks report (gRPC where they fell back), and ranks that disagree
// fail the run.
func TestCollectAuto(t *testing.T) {
	o := Options{Ranks: 2, Sizes: []int64{4}, Reps: 1}
	times := func(a, b string) []rankTimes {
		return []rankTimes{{Rank: 0, SizeBytes: 4, TimesNS: []int64{1}, Transport: a}, {Rank: 1, SizeBytes: 4, TimesNS: []int64{2}, Transport: b}}
	}
	for _, plane := range []string{TransportGRPC, TransportSHM} {
		rs, err := collect("", o, aggregator.CostGRPC, times(plane, plane))
		if err != nil || len(rs) != 1 || rs[0].Transport != plane {
			t.Errorf("%s on both ranks: %+v, %v", plane, rs, err)
		}
	}
	if _, err := collect("", o, aggregator.CostGRPC, times(TransportSHM, TransportGRPC)); err == nil {
		t.Error("ranks on different data planes accepted")
	}
}

func TestMem(t *testing.T) {
	rs, err := RunMem(t.Context(), Options{Ranks: 4, Sizes: []int64{1 << 20}, Reps: 3})
	if err != nil || len(rs) != 1 || rs[0].BusBW <= 0 {
		t.Fatalf("%+v, %v", rs, err)
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("1M,4K,16,2G")
	if err != nil || len(got) != 4 || got[0] != 1<<20 || got[1] != 4<<10 || got[2] != 16 || got[3] != 2<<30 {
		t.Fatalf("%v, %v", got, err)
	}
	if _, err := ParseSizes("1X"); err == nil {
		t.Error("1X accepted")
	}
}

// TestCompare prints the benchmark table when ALLREDUCEBENCH_RANKS is set
// (e.g. "2,4"); ALLREDUCEBENCH_SIZES (default 1M,4M,16M,64M),
// ALLREDUCEBENCH_REPS (15) and ALLREDUCEBENCH_FRAME (elements per frame).
func TestCompare(t *testing.T) {
	ranks := os.Getenv("ALLREDUCEBENCH_RANKS")
	if ranks == "" {
		t.Skip("set ALLREDUCEBENCH_RANKS to run")
	}
	sizes, err := ParseSizes(envOr("ALLREDUCEBENCH_SIZES", "1M,4M,16M,64M"))
	if err != nil {
		t.Fatal(err)
	}
	reps, _ := strconv.Atoi(envOr("ALLREDUCEBENCH_REPS", "15"))
	frame, _ := strconv.Atoi(envOr("ALLREDUCEBENCH_FRAME", "0"))
	inbox, _ := strconv.Atoi(envOr("ALLREDUCEBENCH_INBOX", "0"))
	var all []Result
	for f := range strings.SplitSeq(ranks, ",") {
		n, _ := strconv.Atoi(f)
		all = append(all, runProcs(t, ParentOptions{Options: Options{Ranks: n, Sizes: sizes, Reps: reps, FrameElems: frame, InboxFrames: inbox, OutboxFrames: inbox}})...)
	}
	var b strings.Builder
	_ = WriteTable(&b, all)
	t.Log("\n" + b.String())
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// TestAlgorithms: every algorithm, auto included, runs interleaved on the
// transports that carry them, each on its own line naming what ran and
// the model's pick; the process transports refuse them.
func TestAlgorithms(t *testing.T) {
	algos := []aggregator.Algorithm{aggregator.AlgoRing, aggregator.AlgoHalvingDoubling, aggregator.AlgoTree, aggregator.AlgoAuto}
	o := Options{Ranks: 3, Sizes: []int64{4 << 10, 1 << 20}, Reps: 2, Warmup: 1, Algorithms: algos}
	runs := map[string]func(context.Context, Options) ([]Result, error){TransportMem: RunMem}
	if runtime.GOOS == "linux" {
		runs[TransportSHMPairs] = RunSHMPairs
	}
	for transport, run := range runs {
		o.Calibrate = transport == TransportSHMPairs
		rs, err := run(t.Context(), o)
		if err != nil {
			t.Fatalf("%s: %v", transport, err)
		}
		if len(rs) != len(o.Sizes)*len(algos) {
			t.Fatalf("%s: %d results, want %d: %+v", transport, len(rs), len(o.Sizes)*len(algos), rs)
		}
		for i, r := range rs {
			want := algos[i%len(algos)]
			if r.Transport != transport || r.Algorithm != want.String() || r.TimeMS <= 0 || r.ModelPick == "" || r.ModelMS <= 0 {
				t.Errorf("%s: result %d: %+v", transport, i, r)
			}
			if len(r.Estimates) != len(aggregator.Algorithms) || r.ModelAlphaUS <= 0 {
				t.Errorf("%s: result %d: estimates %v, alpha %vµs", transport, i, r.Estimates, r.ModelAlphaUS)
			}
			if want == aggregator.AlgoAuto && r.Ran != r.ModelPick {
				t.Errorf("%s: auto ran %s, the model picks %s", transport, r.Ran, r.ModelPick)
			}
		}
	}
	_, err := RunParent(t.Context(), ParentOptions{Transport: TransportGRPC, Options: o}, os.Args[0], nil)
	if err == nil || !strings.Contains(err.Error(), "runs the ring only") {
		t.Errorf("grpc with peer algorithms: %v, want a refusal", err)
	}
}

func TestParseAlgorithms(t *testing.T) {
	got, err := ParseAlgorithms("ring,halving_doubling,tree,auto")
	if err != nil || len(got) != 4 || got[1] != aggregator.AlgoHalvingDoubling {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"ring,ring", "nccl", "ring,"} {
		if _, err := ParseAlgorithms(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
