package data

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// checkGolden compares got with the golden file at path, or with -update
// writes it there; what names what the file holds, for the failure.
func checkGolden(t *testing.T, path, what, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("%s differ from %s:\ngot:\n%swant:\n%s", what, path, got, want)
	}
}

// goldenLabels is the fixed input for the golden histograms: 100 examples of
// 5 classes with 10, 15, 20, 25 and 30 examples, in a scrambled order.
func goldenLabels() []int32 {
	var sorted []int32
	for k := range 5 {
		for range 10 + 5*k {
			sorted = append(sorted, int32(k))
		}
	}
	out := make([]int32, len(sorted))
	for i := range sorted {
		out[(i*37)%len(sorted)] = sorted[i] // 37 is coprime with 100
	}
	return out
}

// checkExactlyOnce fails unless every index in [0, n) is in exactly one part
// and each part is ascending.
func checkExactlyOnce(t *testing.T, parts [][]int, n int) {
	t.Helper()
	seen := make([]int, n)
	for c, p := range parts {
		if !slices.IsSorted(p) {
			t.Fatalf("client %d's indices are not ascending", c)
		}
		for _, i := range p {
			if i < 0 || i >= n {
				t.Fatalf("client %d: index %d out of range [0, %d)", c, i, n)
			}
			seen[i]++
		}
	}
	for i, s := range seen {
		if s != 1 {
			t.Fatalf("index %d assigned %d times, want exactly once", i, s)
		}
	}
}

type partitionCase struct {
	name string
	run  func(labels []int32, seed int64) ([][]int, error)
}

var partitionCases = []partitionCase{
	{"iid_c7", func(l []int32, s int64) ([][]int, error) { return PartitionIID(l, 7, s), nil }},
	{"dirichlet_a0.1_c6", func(l []int32, s int64) ([][]int, error) { return PartitionDirichlet(l, 5, 6, 0.1, s) }},
	{"dirichlet_a1_c6", func(l []int32, s int64) ([][]int, error) { return PartitionDirichlet(l, 5, 6, 1, s) }},
	{"dirichlet_a100_c6", func(l []int32, s int64) ([][]int, error) { return PartitionDirichlet(l, 5, 6, 100, s) }},
	{"shards_c5_s2", func(l []int32, s int64) ([][]int, error) { return PartitionShards(l, 5, 2, s) }},
	{"shards_c7_s3", func(l []int32, s int64) ([][]int, error) { return PartitionShards(l, 7, 3, s) }},
	{"label_c3", func(l []int32, s int64) ([][]int, error) { return PartitionLabel(l, 5, 3, s) }},
	{"label_c5", func(l []int32, s int64) ([][]int, error) { return PartitionLabel(l, 5, 5, s) }},
	{"label_c12", func(l []int32, s int64) ([][]int, error) { return PartitionLabel(l, 5, 12, s) }},
}

func TestPartitionExactlyOnce(t *testing.T) {
	for _, n := range []int{0, 1, 37, 100, 1000} {
		labels := make([]int32, n)
		for i := range labels {
			labels[i] = int32((i * i) % 5)
		}
		for _, pc := range partitionCases {
			t.Run(fmt.Sprintf("%s/n=%d", pc.name, n), func(t *testing.T) {
				parts, err := pc.run(labels, 3)
				if err != nil {
					if strings.HasPrefix(pc.name, "shards") && n < 21 {
						return // more shards than examples: an error is right
					}
					t.Fatal(err)
				}
				checkExactlyOnce(t, parts, n)
				again, _ := pc.run(labels, 3)
				if !slicesEqual2(parts, again) {
					t.Fatal("same seed gave a different partition")
				}
			})
		}
	}
}

func slicesEqual2(a, b [][]int) bool {
	return slices.EqualFunc(a, b, func(x, y []int) bool { return slices.Equal(x, y) })
}

// TestPartitionGolden pins per-client label histograms for a fixed input and
// seed. Regenerate with: go test ./data -run TestPartitionGolden -update
func TestPartitionGolden(t *testing.T) {
	labels := goldenLabels()
	for _, pc := range partitionCases {
		t.Run(pc.name, func(t *testing.T) {
			parts, err := pc.run(labels, 2017)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "# %s, seed 2017: per-client label histograms (classes 0..4) and sizes\n", pc.name)
			for c, p := range parts {
				fmt.Fprintf(&b, "client %2d: %v n=%d\n", c, Histogram(labels, p, 5), len(p))
			}
			checkGolden(t, filepath.Join("testdata", "golden", "partition_"+pc.name+".txt"), "histograms", b.String())
		})
	}
}

// skew is the mean over clients of the total-variation distance between the
// client's label distribution and the global one (0 = IID).
func skew(labels []int32, parts [][]int, classes int) float64 {
	global := Histogram(labels, seq(len(labels)), classes)
	var sum float64
	var counted int
	for _, p := range parts {
		if len(p) == 0 {
			continue
		}
		h := Histogram(labels, p, classes)
		var tv float64
		for k := range h {
			tv += math.Abs(float64(h[k])/float64(len(p)) - float64(global[k])/float64(len(labels)))
		}
		sum += tv / 2
		counted++
	}
	return sum / float64(counted)
}

func TestPartitionDirichletSkew(t *testing.T) {
	labels := make([]int32, 10000)
	for i := range labels {
		labels[i] = int32(i % 10)
	}
	small, err := PartitionDirichlet(labels, 10, 20, 0.05, 1)
	if err != nil {
		t.Fatal(err)
	}
	large, err := PartitionDirichlet(labels, 10, 20, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	sSmall, sLarge := skew(labels, small, 10), skew(labels, large, 10)
	t.Logf("mean TV distance from global: α=0.05 %.3f, α=1000 %.3f", sSmall, sLarge)
	if sSmall < 0.6 {
		t.Errorf("α=0.05: skew %.3f, want ≥ 0.6 (clients dominated by few classes)", sSmall)
	}
	if sLarge > 0.05 {
		t.Errorf("α=1000: skew %.3f, want ≤ 0.05 (near IID)", sLarge)
	}
	for c, p := range large {
		if len(p) < 400 || len(p) > 600 {
			t.Errorf("α=1000: client %d has %d examples, want about 500", c, len(p))
		}
	}
	// Tiny α must not underflow into NaN proportions.
	tiny, err := PartitionDirichlet(labels, 10, 20, 1e-3, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, tiny, len(labels))
}

func TestPartitionShardsClasses(t *testing.T) {
	labels := make([]int32, 6000)
	for i := range labels {
		labels[i] = int32(i % 10)
	}
	parts, err := PartitionShards(labels, 100, 2, 1) // 200 shards of 30: one class each
	if err != nil {
		t.Fatal(err)
	}
	for c, p := range parts {
		classes := 0
		for _, v := range Histogram(labels, p, 10) {
			if v > 0 {
				classes++
			}
		}
		if len(p) != 60 || classes > 2 {
			t.Fatalf("client %d: %d examples of %d classes, want 60 of ≤ 2", c, len(p), classes)
		}
	}
}

func TestPartitionLabelDisjoint(t *testing.T) {
	labels := goldenLabels()
	for _, clients := range []int{1, 2, 3, 5, 7, 12} {
		parts, err := PartitionLabel(labels, 5, clients, 9)
		if err != nil {
			t.Fatal(err)
		}
		// Clients with any label in common must hold exactly the same labels.
		sets := make([][]bool, clients)
		for c, p := range parts {
			sets[c] = make([]bool, 5)
			for k, v := range Histogram(labels, p, 5) {
				sets[c][k] = v > 0
			}
		}
		for a := range sets {
			for b := range sets {
				share := false
				for k := range 5 {
					share = share || (sets[a][k] && sets[b][k])
				}
				if share && !slices.Equal(sets[a], sets[b]) {
					t.Fatalf("clients=%d: clients %d and %d overlap without the same labels: %v vs %v", clients, a, b, sets[a], sets[b])
				}
			}
		}
	}
}

func TestPartitionErrors(t *testing.T) {
	labels := []int32{0, 1, 2, 3}
	for name, f := range map[string]func() error{
		"dirichlet alpha 0":   func() error { _, err := PartitionDirichlet(labels, 4, 2, 0, 1); return err },
		"dirichlet alpha NaN": func() error { _, err := PartitionDirichlet(labels, 4, 2, math.NaN(), 1); return err },
		"dirichlet alpha Inf": func() error { _, err := PartitionDirichlet(labels, 4, 2, math.Inf(1), 1); return err },
		"dirichlet label":     func() error { _, err := PartitionDirichlet(labels, 3, 2, 1, 1); return err },
		"dirichlet clients":   func() error { _, err := PartitionDirichlet(labels, 4, 0, 1, 1); return err },
		"shards too many":     func() error { _, err := PartitionShards(labels, 3, 2, 1); return err },
		"shards clients":      func() error { _, err := PartitionShards(labels, 0, 2, 1); return err },
		"shards per client":   func() error { _, err := PartitionShards(labels, 2, 0, 1); return err },
		"label classes":       func() error { _, err := PartitionLabel(labels, 0, 2, 1); return err },
		"label label":         func() error { _, err := PartitionLabel(labels, 2, 2, 1); return err },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.HasPrefix(err.Error(), "data: Partition") {
			t.Errorf("%s: error %q lacks the data: PartitionX prefix", name, err)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("PartitionIID with 0 clients did not panic")
			}
		}()
		PartitionIID(labels, 0, 1)
	}()
}

func TestApportion(t *testing.T) {
	counts := make([]int, 3)
	for _, tt := range []struct {
		props []float64
		total int
		want  []int
	}{
		{[]float64{0.5, 0.25, 0.25}, 8, []int{4, 2, 2}},
		{[]float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, 10, []int{4, 3, 3}},
		{[]float64{0, 0, 1}, 5, []int{0, 0, 5}},
		{[]float64{0.2, 0.3, 0.5}, 0, []int{0, 0, 0}},
	} {
		apportion(counts, tt.props, tt.total)
		if !slices.Equal(counts, tt.want) {
			t.Errorf("apportion(%v, %d) = %v, want %v", tt.props, tt.total, counts, tt.want)
		}
	}
}
