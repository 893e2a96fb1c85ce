// Command gradsync is the one binary of the gradsync training service: the
// coordinator (server), the worker, a whole local cluster in one process
// (local), and the client commands (submit, jobs, watch, cancel, workers).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// exitError carries a process exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// globals are the flags every command has.
type globals struct {
	server    string
	json      bool
	logLevel  string
	logFormat string
	sec       secFlags
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "gradsync:", err)
		os.Exit(1)
	}
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "gradsync",
		Short: "Distributed training of image classifiers over gRPC",
		Long: `gradsync trains image classifiers on many workers that exchange gradients
over gRPC. Try:

  gradsync local --workers 2 --model mlp --dataset mnist --epochs 1`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", envOr("GRADSYNC_SERVER", "localhost:7070"), "coordinator address host:port (env GRADSYNC_SERVER)")
	pf.BoolVar(&g.json, "json", false, "print machine-readable JSON lines instead of text")
	pf.StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (default info; warn for local)")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	g.sec.register(root)
	root.AddCommand(newLocalCmd(g), newServerCmd(g), newWorkerCmd(g), newAggregatorCmd(g), newSubmitCmd(g), newJobsCmd(g),
		newWatchCmd(g), newCancelCmd(g), newWorkersCmd(g), newBenchCmd(g), newCertsCmd(g), newLogsCmd(g))
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// logger builds the process logger (to stderr).
func (g *globals) logger(w io.Writer, def slog.Level) (*slog.Logger, error) {
	lvl := def
	if g.logLevel != "" {
		if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
			return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
		}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", g.logFormat)
}
