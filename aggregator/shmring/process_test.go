//go:build linux

package shmring_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/shmring"
)

// Environment of a rank process started by TestKill9.
const (
	helperEnv  = "SHMRING_TEST_RANK" // this process is that rank
	helperSize = "SHMRING_TEST_SIZE"
	helperDir  = "SHMRING_TEST_DIR"
)

// report is what a rank process prints (one JSON object a line) as it
// goes: its offer, "ready", "running" after its first all-reduce, its
// failure, and whether goroutines leaked after Close.
type report struct {
	Offer   *shmring.Offer `json:",omitempty"`
	Event   string         `json:",omitempty"`
	Err     string         `json:",omitempty"`
	Peer    int            // the rank a *PeerError named; -1: none
	Gone    bool           // the error wraps aggregator.ErrPeerGone
	Elapsed time.Duration  // from the failed call's start
}

// helperMain is one rank of TestKill9's ring: it creates its segment,
// prints the offer, reads its left neighbour's offer from stdin, connects,
// and all-reduces until the ring breaks; then it waits for a line on
// stdin before it closes the ring (so that survivors do not break each
// other's links first) and checks for leaked goroutines.
func helperMain() int {
	rank, _ := strconv.Atoi(os.Getenv(helperEnv))
	n, _ := strconv.Atoi(os.Getenv(helperSize))
	out := json.NewEncoder(os.Stdout)
	say := func(r report) {
		if err := out.Encode(r); err != nil {
			os.Exit(3)
		}
	}
	fail := func(err error) int {
		say(report{Event: "error", Err: err.Error(), Peer: -1})
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	p, offer, err := shmring.Create(shmring.Config{Dir: os.Getenv(helperDir), JobID: "kill9", Rank: rank, Size: n, Secret: secret})
	if err != nil {
		return fail(err)
	}
	say(report{Offer: &offer, Peer: -1})
	var left shmring.Offer
	if !in.Scan() {
		return fail(errors.New("no offer on stdin"))
	}
	if err := json.Unmarshal(in.Bytes(), &left); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := p.Connect(ctx, left)
	if err != nil {
		return fail(err)
	}
	say(report{Event: "ready", Peer: -1})
	buf := make([]float32, 1<<16)
	var callErr error
	var elapsed time.Duration
	for step := int64(1); callErr == nil; step++ {
		for i := range buf {
			buf[i] = float32(rank + 1)
		}
		start := time.Now()
		// The deadline a worker's step would have; the kill must be
		// noticed long before it.
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		callErr = aggregator.AllReduce(cctx, r, buf, step, aggregator.Options{MaxFrameElems: 1024})
		ccancel()
		elapsed = time.Since(start)
		if callErr == nil {
			if want := float32(n * (n + 1) / 2); buf[0] != want || buf[len(buf)-1] != want {
				return fail(fmt.Errorf("step %d: sum %v, want %v", step, buf[0], want))
			}
			if step == 1 {
				say(report{Event: "running", Peer: -1})
			}
		}
	}
	rep := report{Event: "failed", Err: callErr.Error(), Peer: -1, Gone: errors.Is(callErr, aggregator.ErrPeerGone), Elapsed: elapsed}
	if pe := new(aggregator.PeerError); errors.As(callErr, &pe) {
		rep.Peer = pe.Rank
	}
	say(rep)
	in.Scan() // the test says when to close
	r.Close()
	if err := goleak.Find(); err != nil {
		say(report{Event: "leak", Err: err.Error(), Peer: -1})
		return 1
	}
	say(report{Event: "closed", Peer: -1})
	return 0
}

// rankProc is one rank process of TestKill9 and the reports it printed.
type rankProc struct {
	cmd     *exec.Cmd
	stdin   *json.Encoder
	closeIn func() error
	reports chan report
}

// TestKill9 runs rings of 2 and 3 separate processes over shared memory
// and kills one with SIGKILL in the middle of its all-reduces: every
// survivor (each is a neighbour of it) fails with a *PeerError naming it
// long before their deadline, no segment is left in the directory, and
// no goroutine is leaked in the survivors.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) { testKill9(t, n) })
	}
}

func testKill9(t *testing.T, n int) {
	const victim = 1
	dir := segDir(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // only a bug waits for it
	defer cancel()
	procs := make([]*rankProc, n)
	for i := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+strconv.Itoa(i), helperSize+"="+strconv.Itoa(n), helperDir+"="+dir)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &rankProc{cmd: cmd, stdin: json.NewEncoder(stdin), closeIn: stdin.Close, reports: make(chan report, 16)}
		procs[i] = p
		// The reader ends when the process's stdout closes (it exits, or
		// the context kills it); Wait below waits for it.
		go func() {
			defer close(p.reports)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var r report
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					r = report{Event: "garbage", Err: sc.Text(), Peer: -1}
				}
				p.reports <- r
			}
		}()
	}
	defer func() {
		for _, p := range procs {
			p.closeIn()
			_ = p.cmd.Wait()
			for range p.reports { // drain, so the reader has ended
			}
		}
	}()
	next := func(i int, want string) report {
		t.Helper()
		select {
		case r, ok := <-procs[i].reports:
			if !ok {
				t.Fatalf("rank %d exited before %s", i, want)
			}
			if r.Event != want && !(want == "offer" && r.Offer != nil) {
				t.Fatalf("rank %d: got %+v, want %s", i, r, want)
			}
			return r
		case <-ctx.Done():
			t.Fatalf("rank %d: no %s: %v", i, want, ctx.Err())
		}
		panic("unreachable")
	}
	offers := make([]shmring.Offer, n)
	for i := range n {
		offers[i] = *next(i, "offer").Offer
	}
	for i := range n {
		if err := procs[i].stdin.Encode(offers[(i+n-1)%n]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		next(i, "ready")
	}
	if left := entries(t, dir); len(left) != 0 {
		t.Fatalf("segments left in %s once the ring is up: %v", dir, left)
	}
	for i := range n {
		next(i, "running")
	}
	if err := procs[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if i == victim {
			continue
		}
		r := next(i, "failed")
		t.Logf("rank %d failed after %v: %s", i, r.Elapsed, r.Err)
		if r.Peer != victim || !r.Gone {
			t.Errorf("rank %d: failed with %q, want a *PeerError naming rank %d wrapping ErrPeerGone", i, r.Err, victim)
		}
		if r.Elapsed > 30*time.Second {
			t.Errorf("rank %d: failed after %v", i, r.Elapsed)
		}
		if !strings.Contains(r.Err, fmt.Sprintf("rank %d:", victim)) {
			t.Errorf("rank %d: the error %q does not name rank %d", i, r.Err, victim)
		}
	}
	for i := range n {
		if i == victim {
			continue
		}
		procs[i].closeIn()
		next(i, "closed")
		for r := range procs[i].reports { // to EOF, before Wait closes the pipe
			t.Errorf("rank %d after closing: %+v", i, r)
		}
		// A failure the child could only print (the race detector's,
		// say) shows in its exit status.
		if err := procs[i].cmd.Wait(); err != nil {
			t.Errorf("rank %d: %v", i, err)
		}
	}
	if left := entries(t, dir); len(left) != 0 {
		t.Errorf("segments left in %s: %v", dir, left)
	}
}
