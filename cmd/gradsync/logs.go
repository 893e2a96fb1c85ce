package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newLogsCmd is `gradsync logs JOB --rank R`: the output of an entrypoint
// job's command on one rank, as its worker appends it to
// <runs-dir>/<job>/rank-R.log (read on the machine that has the file:
// `gradsync local`'s, or a worker's).
func newLogsCmd(g *globals) *cobra.Command {
	var runsDir string
	var rank int
	var follow bool
	c := &cobra.Command{
		Use:   "logs JOB-ID",
		Short: "Print (or follow) the output of an entrypoint job's command on one rank",
		Example: `  gradsync logs JOB-ID --rank 1
  gradsync logs JOB-ID --rank 0 --follow --runs-dir /srv/runs`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			job := args[0]
			if job == "" || strings.ContainsAny(job, `/\`) || job == "." || job == ".." {
				return fmt.Errorf("%q is not a job id", job)
			}
			if rank < 0 {
				return fmt.Errorf("--rank %d: want 0 or more", rank)
			}
			path := filepath.Join(runsDir, job, fmt.Sprintf("rank-%d.log", rank))
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("no output of job %s rank %d here (%w); it is written on the rank's worker, under its --runs-dir", job, rank, err)
			}
			defer f.Close()
			p := &printer{out: c.OutOrStdout(), json: g.json}
			return copyLog(c.Context(), f, p, job, rank, follow)
		},
	}
	c.Flags().StringVar(&runsDir, "runs-dir", "runs", "where the worker writes run directories (runs/<job-id>/rank-R.log)")
	c.Flags().IntVar(&rank, "rank", 0, "the rank whose output to print")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what is appended, until interrupted")
	return c
}

// copyLog prints f's lines (as log events with --json); with follow it
// then waits for more until ctx is done.
func copyLog(ctx context.Context, f io.Reader, p *printer, job string, rank int, follow bool) error {
	r := bufio.NewReader(f)
	var partial string
	var tick *time.Ticker
	for {
		s, err := r.ReadString('\n')
		partial += s
		if err == nil {
			line := strings.TrimSuffix(partial, "\n")
			partial = ""
			if p.json {
				p.jsonLine(logLine{Event: "log", JobID: job, Rank: rank, Message: line})
			} else {
				fmt.Fprintln(p.out, line)
			}
			continue
		}
		if !errors.Is(err, io.EOF) {
			return err
		}
		if !follow {
			if partial != "" {
				fmt.Fprint(p.out, partial)
			}
			return nil
		}
		if tick == nil {
			tick = time.NewTicker(200 * time.Millisecond) // a file gives no event to wait on
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
