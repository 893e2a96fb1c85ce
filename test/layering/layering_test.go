package layering

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
	"time"
)

// layers are the module's packages from top to bottom, as paths relative
// to the module ("…/x" matches x and everything under it). A package may
// import packages of its own layer and of the layers below it, never of a
// layer above: internal/ imports no top-level package, cores never import
// the shells that host them, and the wire contract imports nothing of
// the module. A package that no layer names fails the test, so a new
// package is placed on purpose. Packages that do not exist yet are named
// so their place is decided before they arrive. Only the packages' own
// files count: tests may import whatever they need.
var layers = []struct {
	name     string
	packages []string
}{
	{"programs and end-to-end tests", []string{"cmd/…", "test", "test/…", "docs/…", "scripts/…"}},
	{"shells (gRPC, processes, I/O)", []string{"server", "worker", "agent", "paramserver", "federation", "bench/…"}},
	{"cores and domain packages", []string{
		"coordinator", "aggregator", "aggregator/ringrpc", "aggregator/ringtest", "aggregator/peertest", "aggregator/internal/suite", "aggregator/shmring", "paramserver/psstep", "compress",
		"federated", "models", "models/modeltest", "data", "checkpoint", "jobspec", "pipeline",
		"pipeline/stage", "pipeline/stage/stagetest", "pipeline/peerrpc", "tensorpar"}},
	{"machinery (internal)", []string{"internal/…"}},
	{"wire contract", []string{"proto/…"}},
}

// layerOf returns the index in layers of the package rel (a path relative
// to the module), or -1 when no layer names it.
func layerOf(rel string) int {
	for i, l := range layers {
		for _, p := range l.packages {
			if base, ok := strings.CutSuffix(p, "/…"); ok {
				if rel == base || strings.HasPrefix(rel, base+"/") {
					return i
				}
			} else if rel == p {
				return i
			}
		}
	}
	return -1
}

type pkg struct {
	ImportPath string
	Module     *struct{ Path string }
	Imports    []string
}

// listPackages returns the module's packages with their imports (go list
// -json ./... from the module root).
func listPackages(ctx context.Context, t *testing.T) (module string, pkgs []pkg) {
	root, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-json=ImportPath,Module,Imports", "./...")
	cmd.Dir = path.Dir(strings.TrimSpace(string(root)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0].Module == nil {
		t.Fatal("go list found no packages of a module")
	}
	return pkgs[0].Module.Path, pkgs
}

// check returns one line per package no layer names and per import that
// goes up.
func check(module string, pkgs []pkg) []string {
	rel := func(p string) (string, bool) {
		if p == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	var bad []string
	for _, p := range pkgs {
		from, _ := rel(p.ImportPath)
		lf := layerOf(from)
		if lf < 0 {
			bad = append(bad, fmt.Sprintf("%s is in no layer: place it in test/layering's layers and the README's layout section", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			if lt := layerOf(to); lt >= 0 && lt < lf {
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s (%s), a layer above it", from, layers[lf].name, to, layers[lt].name))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func TestLayering(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	module, pkgs := listPackages(ctx, t)
	for _, b := range check(module, pkgs) {
		t.Error(b)
	}
}

// TestLayeringRule checks the checker on a made-up module.
func TestLayeringRule(t *testing.T) {
	const m = "example.com/m"
	pkgs := []pkg{
		{ImportPath: m + "/cmd/x", Imports: []string{m + "/server", m + "/internal/rpc", "fmt"}},
		{ImportPath: m + "/server", Imports: []string{m + "/worker", m + "/coordinator", m + "/proto/v1"}},
		{ImportPath: m + "/coordinator", Imports: []string{m + "/server"}},
		{ImportPath: m + "/internal/eval", Imports: []string{m + "/models", m + "/internal/kernels"}},
		{ImportPath: m + "/proto/v1", Imports: []string{m + "/internal/wire"}},
		{ImportPath: m + "/newthing"},
	}
	got := check(m, pkgs)
	want := []string{
		"coordinator (cores and domain packages) imports server (shells (gRPC, processes, I/O)), a layer above it",
		"internal/eval (machinery (internal)) imports models (cores and domain packages), a layer above it",
		"newthing is in no layer: place it in test/layering's layers and the README's layout section",
		"proto/v1 (wire contract) imports internal/wire (machinery (internal)), a layer above it",
	}
	if !slices.Equal(got, want) {
		t.Errorf("check =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
