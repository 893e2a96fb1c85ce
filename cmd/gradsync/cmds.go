package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/netem"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/internal/security"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
	"github.com/gradsync/gradsync/worker"
)

func newLocalCmd(g *globals) *cobra.Command {
	var sf specFlags
	var stateDir, runsDir, metricsAddr, linkRate, memLimit string
	var heartbeatTimeout time.Duration
	var threads int
	var tracePath, cpuProfile string
	c := &cobra.Command{
		Use:   "local",
		Short: "Train with a coordinator and N workers in this process, over real gRPC on loopback",
		Example: `  gradsync local --workers 2 --model mlp --dataset mnist --epochs 1
  gradsync local -f job.yaml --json`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			spec, err := sf.build(c)
			if err != nil {
				return err
			}
			log, err := g.logger(c.ErrOrStderr(), slog.LevelWarn)
			if err != nil {
				return err
			}
			stopProfile, err := startCPUProfile(cpuProfile)
			if err != nil {
				return err
			}
			defer stopProfile()
			n := int(spec.GetWorkers())
			if n == 0 {
				n = defaultWorkers(spec)
			}
			if stateDir == "" {
				if stateDir, err = os.MkdirTemp("", "gradsync-local-"); err != nil {
					return err
				}
				defer os.RemoveAll(stateDir)
			}
			// Loopback mTLS with a CA made for this run (nothing written),
			// unless plaintext was asked for.
			scfg := server.Config{DataDir: stateDir, RunsDir: runsDir, Logger: log, Insecure: g.sec.insecure,
				HeartbeatTimeout: heartbeatTimeout}
			// Local workers run entrypoint commands: this is the user's
			// own machine.
			wcfg := worker.Config{Logger: log, Insecure: g.sec.insecure, Threads: threads, AllowEntrypoints: true, RunsDir: runsDir, TracePath: tracePath,
				Algorithm: os.Getenv(algoEnv)}
			if wcfg.Link, err = netem.ParseRate(linkRate); err != nil {
				return fmt.Errorf("--link-rate: %w", err)
			}
			if wcfg.MemoryLimit, err = parseMemory(memLimit); err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			scfg.PlaceByMemory = wcfg.MemoryLimit > 0
			clientOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			if !g.sec.insecure {
				pki, err := security.EphemeralPKI([]string{"localhost", "127.0.0.1"})
				if err != nil {
					return err
				}
				scfg.TLS, scfg.Tokens = pki.ServerTLS(), pki.Tokens()
				wcfg.TLS, wcfg.PeerServerTLS, wcfg.PeerClientTLS = pki.WorkerClientTLS(), pki.WorkerServerTLS(), pki.PeerClientTLS()
				clientOpts = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS())),
					grpc.WithPerRPCCredentials(security.TokenCredentials(pki.Token, true))}
			}
			stopMetrics, err := startMetrics(c.Context(), metricsAddr, log, &scfg.Metrics)
			if err != nil {
				return err
			}
			defer stopMetrics()
			wcfg.Metrics = scfg.Metrics
			srv, err := server.New(scfg)
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			ctx, stop := context.WithCancel(c.Context())
			var wg sync.WaitGroup
			defer func() {
				stop()
				wg.Wait()
			}()
			wg.Add(1)
			go func() { // owned by this command: the coordinator
				defer wg.Done()
				if err := srv.Serve(ctx, lis); err != nil {
					log.Error("server stopped", "err", err)
				}
			}()
			addr := lis.Addr().String()
			for i := range n {
				wc := wcfg
				wc.Server, wc.ID = addr, fmt.Sprintf("local-%d", i)
				w, err := worker.New(wc)
				if err != nil {
					return err
				}
				wg.Add(1)
				go func() { // owned by this command: worker i
					defer wg.Done()
					if err := w.Run(ctx); err != nil {
						log.Error("worker stopped", "err", err)
					}
				}()
			}
			p := &printer{out: c.OutOrStdout(), json: g.json}
			if !g.json {
				fmt.Fprintf(c.OutOrStdout(), "gradsync local: coordinator on %s, %d worker(s)\n", addr, n)
			}
			return submitAndWatch(c.Context(), addr, clientOpts, &pb.SubmitJobRequest{Spec: spec}, p, true)
		},
	}
	sf.register(c)
	c.Flags().StringVar(&stateDir, "state-dir", "", "where the job store goes (default: a temporary folder, removed at exit)")
	c.Flags().StringVar(&runsDir, "runs-dir", "runs", "where run directories (runs/<job-id>) are written")
	c.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics of the server and workers on this address (/metrics)")
	c.Flags().StringVar(&linkRate, "link-rate", "", linkRateHelp)
	c.Flags().StringVar(&memLimit, "memory-limit", "", memoryLimitHelp)
	c.Flags().IntVar(&threads, "threads", 1, threadsHelp)
	c.Flags().StringVar(&tracePath, "trace", "", traceHelp)
	c.Flags().StringVar(&cpuProfile, "cpuprofile", "", cpuProfileHelp)
	c.Flags().DurationVar(&heartbeatTimeout, "heartbeat-timeout", 5*time.Second,
		"silence after which a worker is lost (raise it when the machine is starved, e.g. a long run under nice -n 19)")
	return c
}

// startMetrics serves a new metrics registry on addr (nothing when addr is
// empty) and stores it in *reg; stop ends the HTTP server and waits for it.
func startMetrics(ctx context.Context, addr string, log *slog.Logger, reg **metrics.Registry) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	r := metrics.NewRegistry()
	ctx, cancel := context.WithCancel(ctx)
	bound, wait, err := metrics.Serve(ctx, addr, r, log)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	log.Info("serving metrics", "url", "http://"+bound.String()+"/metrics")
	*reg = r
	return func() {
		cancel()
		_ = wait()
	}, nil
}

// submitAndWatch submits spec to the server at addr; with wait it follows the
// job to its end, prints the summary, and turns a job that did not succeed
// into exit status 1. Interrupting (Ctrl-C) cancels the job.
func submitAndWatch(ctx context.Context, addr string, dialOpts []grpc.DialOption, req *pb.SubmitJobRequest, p *printer, wait bool) error {
	conn, err := dial(addr, dialOpts)
	if err != nil {
		return err
	}
	defer conn.Close()
	jc := pb.NewJobServiceClient(conn)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := jc.SubmitJob(sctx, req)
	cancel()
	if err != nil {
		return err
	}
	id := resp.Job.Id
	if !wait {
		p.job(resp.Job)
		return nil
	}
	final, err := watch(ctx, jc, id, p)
	if ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = jc.CancelJob(cctx, &pb.CancelJobRequest{JobId: id, Reason: "interrupted"})
		cancel()
		return fmt.Errorf("interrupted; job %s cancelled", id)
	}
	if err != nil {
		return fmt.Errorf("watching job %s: %w", id, err)
	}
	p.summary(final)
	if final.State != pb.JobState_JOB_STATE_SUCCEEDED {
		return exitError{code: 1}
	}
	return nil
}

func newServerCmd(g *globals) *cobra.Command {
	var cfg server.Config
	var addr, metricsAddr string
	c := &cobra.Command{
		Use:   "server",
		Short: "Run the coordinator (jobs API, worker registry, parameter server)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return serveService(c, g, addr, metricsAddr, func(b serviceBase) error {
				cfg.Logger, cfg.TLS, cfg.Tokens, cfg.Insecure, cfg.Metrics = b.log, b.tls, b.tokens, b.insecure, b.metrics
				srv, err := server.New(cfg)
				if err != nil {
					return err
				}
				b.log.Info("gradsync server listening", "addr", b.lis.Addr().String(), "data_dir", cfg.DataDir, "runs_dir", cfg.RunsDir,
					"heartbeat_timeout", cfg.HeartbeatTimeout)
				return srv.Serve(c.Context(), b.lis)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&addr, "addr", ":7070", "address to listen on")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (/metrics), e.g. :9090")
	f.Float64Var(&cfg.APIRate, "api-rate", 50, "calls per second each client host may make to the jobs API (burst twice that; negative: no limit)")
	f.StringVar(&cfg.DataDir, "data-dir", "gradsync-data", "where the job store is kept")
	f.StringVar(&cfg.RunsDir, "runs-dir", "runs", "where run directories (runs/<job-id>) are written")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", time.Second, "how often workers send heartbeats")
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", 5*time.Second, "silence after which a worker is lost and its job fails")
	return c
}

func newWorkerCmd(g *globals) *cobra.Command {
	var cfg worker.Config
	var metricsAddr, linkRate, memLimit string
	c := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker that trains what the coordinator assigns",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger(c.ErrOrStderr(), slog.LevelInfo)
			if err != nil {
				return err
			}
			cfg.Logger = log
			cfg.Server = g.server
			if cfg.TLS, cfg.PeerServerTLS, cfg.PeerClientTLS, err = g.sec.worker(); err != nil {
				return err
			}
			cfg.Insecure = g.sec.insecure
			cfg.Algorithm = os.Getenv(algoEnv)
			if cfg.MemoryLimit, err = parseMemory(memLimit); err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			if cfg.Link, err = netem.ParseRate(linkRate); err != nil {
				return fmt.Errorf("--link-rate: %w", err)
			}
			stopMetrics, err := startMetrics(c.Context(), metricsAddr, log, &cfg.Metrics)
			if err != nil {
				return err
			}
			defer stopMetrics()
			w, err := worker.New(cfg)
			if err != nil {
				return err
			}
			return w.Run(c.Context())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.ListenAddr, "addr", "127.0.0.1:0", "address of this worker's peer endpoint")
	f.StringVar(&cfg.AdvertiseAddr, "advertise", "", "address peers use to reach this worker (default: the listen address)")
	f.StringVar(&cfg.ID, "id", "", "stable worker id (default: assigned by the coordinator)")
	f.StringVar(&cfg.Name, "name", "", "human-readable name (default host/address)")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (/metrics), e.g. :9091")
	f.StringVar(&linkRate, "link-rate", "", linkRateHelp)
	f.StringVar(&memLimit, "memory-limit", "", memoryLimitHelp)
	f.StringVar(&cfg.DataDir, "data-dir", "", "folder holding this worker's data (the IDX files of mnist or fashion-mnist, an ImageFolder, the CIFAR files); overrides the job's dataset.data_dir here, so each real federated client trains on its own data")
	f.IntVar(&cfg.Threads, "threads", 1, threadsHelp)
	f.StringVar(&cfg.TracePath, "trace", "", traceHelp)
	f.BoolVar(&cfg.AllowEntrypoints, "allow-entrypoints", false, "run the commands of entrypoint jobs (users' scripts, as this worker's user); off, such jobs are refused and not placed here")
	f.StringVar(&cfg.RunsDir, "runs-dir", "runs", "where entrypoint commands' output goes (<runs-dir>/<job-id>/rank-R.log, read by 'gradsync logs')")
	f.DurationVar(&cfg.DebugStepDelay, "debug-step-delay", 0, "fault injection for tests: wait this long before every training step (a slow worker, which the coordinator reports as a straggler)")
	return c
}

func newAggregatorCmd(g *globals) *cobra.Command {
	var cfg paramserver.ShardServerConfig
	var addr, metricsAddr string
	c := &cobra.Command{
		Use:   "aggregator",
		Short: "Run a parameter-server shard for jobs that name it (parameter_server.addresses)",
		Long: `Run a parameter-server shard process. A ps job whose spec lists
parameter_server.addresses (one per shard, in shard order; or
'gradsync submit --ps-aggregators a:7001,b:7001') has its workers push and
pull that shard's range of the parameters here instead of in the server.
The aggregator needs no set-up per job: it learns each job from the
workers' joins. Security as for the server: --certs DIR (mTLS, only
workers may call it) or --insecure.`,
		Example: `  gradsync aggregator --listen :7001 --certs certs
  gradsync aggregator --listen 127.0.0.1:7002 --insecure`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return serveService(c, g, addr, metricsAddr, func(b serviceBase) error {
				// The aggregator has no jobs API: bearer tokens do not apply.
				cfg.Logger, cfg.TLS, cfg.Insecure, cfg.Metrics = b.log, b.tls, b.insecure, b.metrics
				agg, err := paramserver.NewShardServer(cfg)
				if err != nil {
					return err
				}
				b.log.Info("gradsync aggregator listening", "addr", b.lis.Addr().String())
				return agg.Serve(c.Context(), b.lis)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&addr, "listen", ":7001", "address to listen on")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (/metrics)")
	return c
}

// serviceBase is what `gradsync server` and `gradsync aggregator` set up
// alike before they serve: logger, TLS (and the jobs API's bearer tokens),
// Prometheus metrics and the listener.
type serviceBase struct {
	log      *slog.Logger
	tls      *tls.Config
	tokens   [][]byte
	insecure bool
	metrics  *metrics.Registry
	lis      net.Listener
}

// serveService sets up a serviceBase on addr (with --json, a "listening"
// line) and runs serve with it; the metrics endpoint stops when it returns.
func serveService(c *cobra.Command, g *globals, addr, metricsAddr string, serve func(serviceBase) error) error {
	var b serviceBase
	var err error
	if b.log, err = g.logger(c.ErrOrStderr(), slog.LevelInfo); err != nil {
		return err
	}
	if b.tls, b.tokens, err = g.sec.server(); err != nil {
		return err
	}
	b.insecure = g.sec.insecure
	stopMetrics, err := startMetrics(c.Context(), metricsAddr, b.log, &b.metrics)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if b.lis, err = net.Listen("tcp", addr); err != nil {
		return err
	}
	if g.json {
		p := &printer{out: c.OutOrStdout(), json: true}
		p.jsonLine(listeningEvent{Event: "listening", Address: b.lis.Addr().String()})
	}
	return serve(b)
}

// linkRateHelp documents --link-rate (local and worker).
// traceHelp says what --trace does on a worker.
const traceHelp = "ring jobs: write each rank's timeline (forward and backward per layer, gradient buckets' all-reduces, optimiser) as a Chrome trace to this `file` with -rankR before its extension (chrome://tracing, Perfetto); the summary gets rank 0's compute/communication overlap"

// threadsHelp says what --threads does on a worker. The default stays 1:
// another count changes every job's numbers (within float32 rounding).
const threadsHelp = "goroutines per training step of a ps or ring task, each on a slice of the batch (deterministic for a given count)"

const linkRateHelp = "experiments: emulate a link of this rate each way on the workers' connections, e.g. 1Gbit, 100Mbit (default: unlimited)"

func newSubmitCmd(g *globals) *cobra.Command {
	var sf specFlags
	var wait bool
	var resumeJob string
	c := &cobra.Command{
		Use:   "submit [job.yaml]",
		Short: "Submit a job (from a YAML/JSON file and/or flags)",
		Example: `  gradsync submit job.yaml --watch
  gradsync submit --model mlp --workers 2 --epochs 1 --watch --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 {
				if sf.file != "" {
					return fmt.Errorf("give the job file either as an argument or with -f, not both")
				}
				sf.file = args[0]
			}
			spec, err := sf.build(c)
			if err != nil {
				return err
			}
			req := &pb.SubmitJobRequest{Spec: spec}
			if resumeJob != "" {
				// The old job's spec is used; only --workers may change it.
				var other []string
				c.LocalNonPersistentFlags().Visit(func(f *pflag.Flag) {
					if f.Name != "resume" && f.Name != "watch" && f.Name != "workers" {
						other = append(other, "--"+f.Name)
					}
				})
				if len(other) > 0 || len(args) > 0 {
					return fmt.Errorf("--resume runs the old job's spec: only --workers may be given with it, not %v", append(other, args...))
				}
				req = &pb.SubmitJobRequest{ResumeJobId: resumeJob, Spec: &pb.JobSpec{Workers: spec.Workers}}
			}
			opts, err := g.sec.clientDialOptions()
			if err != nil {
				return err
			}
			return submitAndWatch(c.Context(), g.server, opts, req, &printer{out: c.OutOrStdout(), json: g.json}, wait)
		},
	}
	sf.register(c)
	c.Flags().BoolVarP(&wait, "watch", "w", false, "follow the job until it ends and print its summary")
	c.Flags().StringVar(&resumeJob, "resume", "", "run an ended job again from its latest checkpoint (any mode, with checkpoint settings); --workers may change (fedavg with real clients: the same number, or 1)")
	return c
}

func clientCall(ctx context.Context, g *globals, fn func(context.Context, pb.JobServiceClient, pb.ClusterServiceClient) error) error {
	conn, err := g.dialServer()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return fn(ctx, pb.NewJobServiceClient(conn), pb.NewClusterServiceClient(conn))
}

func newJobsCmd(g *globals) *cobra.Command {
	var state string
	var limit int32
	c := &cobra.Command{
		Use:   "jobs",
		Short: "List jobs, newest first",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var st pb.JobState
			if state != "" {
				v, ok := pb.JobState_value["JOB_STATE_"+state]
				if !ok {
					return fmt.Errorf("--state %q: want PENDING, RUNNING, SUCCEEDED, FAILED or CANCELLED", state)
				}
				st = pb.JobState(v)
			}
			return clientCall(c.Context(), g, func(ctx context.Context, jc pb.JobServiceClient, _ pb.ClusterServiceClient) error {
				resp, err := jc.ListJobs(ctx, &pb.ListJobsRequest{State: st, PageSize: limit})
				if err != nil {
					return err
				}
				p := &printer{out: c.OutOrStdout(), json: g.json}
				if !g.json {
					fmt.Fprintf(c.OutOrStdout(), "%-28s %-10s %-8s %-14s %-5s %2s  %-8s %-19s  %s\n", "ID", "STATE", "MODEL", "DATASET", "MODE", "W", "ACC", "CREATED", "MESSAGE")
				}
				for _, j := range resp.Jobs {
					p.job(j)
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&state, "state", "", "only jobs in this state (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED)")
	c.Flags().Int32Var(&limit, "limit", 100, "at most this many jobs (1..1000)")
	return c
}

func newWatchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch JOB",
		Short: "Follow a job's progress until it ends",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			conn, err := g.dialServer()
			if err != nil {
				return err
			}
			defer conn.Close()
			p := &printer{out: c.OutOrStdout(), json: g.json}
			final, err := watch(c.Context(), pb.NewJobServiceClient(conn), args[0], p)
			if err != nil {
				return err
			}
			p.summary(final)
			if final.State != pb.JobState_JOB_STATE_SUCCEEDED {
				return exitError{code: 1}
			}
			return nil
		},
	}
}

func newCancelCmd(g *globals) *cobra.Command {
	var reason string
	c := &cobra.Command{
		Use:   "cancel JOB",
		Short: "Cancel a pending or running job",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return clientCall(c.Context(), g, func(ctx context.Context, jc pb.JobServiceClient, _ pb.ClusterServiceClient) error {
				resp, err := jc.CancelJob(ctx, &pb.CancelJobRequest{JobId: args[0], Reason: reason})
				if err != nil {
					return err
				}
				p := &printer{out: c.OutOrStdout(), json: g.json}
				if g.json {
					p.job(resp.Job)
				} else {
					fmt.Fprintf(c.OutOrStdout(), "job %s %s\n", resp.Job.Id, runlog.StateName(resp.Job.State))
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why (kept in the job's message)")
	return c
}

func newWorkersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "workers",
		Short: "List the workers the coordinator knows",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return clientCall(c.Context(), g, func(ctx context.Context, _ pb.JobServiceClient, cc pb.ClusterServiceClient) error {
				resp, err := cc.ListWorkers(ctx, &pb.ListWorkersRequest{})
				if err != nil {
					return err
				}
				p := &printer{out: c.OutOrStdout(), json: g.json}
				out := c.OutOrStdout()
				if !g.json {
					fmt.Fprintf(out, "%-14s %-6s %-22s %4s %4s %8s %-9s %-28s %s\n", "ID", "STATE", "ADDRESS", "CPUS", "GPUS", "MEMORY", "GEMM", "JOB", "LAST HEARTBEAT")
				}
				for _, w := range resp.Workers {
					if g.json {
						p.jsonLine(workerLineOf(w))
						continue
					}
					fmt.Fprintf(out, "%-14s %-6s %-22s %4d %4d %8s %-9s %-28s %s\n", w.Id, workerStateName(w.State), w.Address,
						w.GetResources().GetCpuCores(), len(w.GetResources().GetGpus()), memoryColumn(w.GetMemoryBytes()), w.GetResources().GetGemmBackend(), w.JobId,
						w.GetLastHeartbeat().AsTime().Local().Format("15:04:05"))
				}
				return nil
			})
		},
	}
}
