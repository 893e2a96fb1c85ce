// Package metrics defines gradsync's Prometheus metrics and serves them
// over HTTP at /metrics, with /healthz beside it.
//
// A Registry holds its own prometheus.Registry (never the global one), so
// several servers and workers can run in one process — as in tests and
// `gradsync local` — without colliding. Its methods are the whole API the
// rest of gradsync uses; they take plain Go values, so callers cannot get a
// label order wrong, and they are no-ops on a nil *Registry, so code paths
// built without metrics need no checks.
//
// gRPC servers add the interceptors of [Registry.GRPCServerOptions] to
// their chain; after registering their services they call
// [Registry.InitializeGRPC] so every method is exported with zero counts
// before its first call.
package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
)

const namespace = "gradsync"

// JobStates are the job states exported, at zero, before any job exists,
// so that dashboards and alerts see every series from the first scrape.
var JobStates = []string{"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}

// Bucket bounds in seconds.
var (
	// stepBuckets span a tiny model on a GPU (1 ms) to a large model on a
	// CPU (about a minute).
	stepBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)
	// collectiveBuckets span a loopback all-reduce of a small buffer
	// (100 µs) to a slow WAN exchange (about half a minute).
	collectiveBuckets = prometheus.ExponentialBuckets(0.0001, 2, 19)
	// grpcBuckets are for whole RPCs; long-lived streams land in +Inf.
	grpcBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// Registry is gradsync's set of metrics. It is safe for concurrent use.
// The zero value is not usable; create one with NewRegistry.
type Registry struct {
	reg  *prometheus.Registry
	grpc *grpcprom.ServerMetrics

	jobs              *prometheus.GaugeVec // state
	stepSeconds       prometheus.Histogram
	imagesPerSecond   *prometheus.GaugeVec     // job, rank
	sentBytes         *prometheus.CounterVec   // job, peer
	receivedBytes     *prometheus.CounterVec   // job, peer
	compressionRatio  *prometheus.GaugeVec     // job
	gradRawBytes      *prometheus.CounterVec   // job
	gradSentBytes     *prometheus.CounterVec   // job
	compressSeconds   *prometheus.CounterVec   // job
	collectiveSeconds *prometheus.HistogramVec // op
	heartbeatsMissed  prometheus.Counter
	recoveries        prometheus.Counter
	nonFiniteSkips    prometheus.Counter
	stragglerDelay    *prometheus.GaugeVec // job, rank
	stragglers        prometheus.Counter

	mu     sync.Mutex                   // guards states and compressed
	states map[string]bool              // every state SetJobCounts has exported
	seen   map[string]CompressionTotals // per job, the totals last observed
}

// CompressionTotals are a job's cumulative gradient-compression counters on
// one process (compress.Stats): bytes before and after compression and the
// seconds spent compressing.
type CompressionTotals struct {
	RawBytes, SentBytes int64
	Seconds             float64
}

// NewRegistry creates a registry with gradsync's metrics, the Go runtime
// and process collectors, and gRPC server metrics with a handling-time
// histogram.
func NewRegistry() *Registry {
	r := &Registry{
		reg: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(
			grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(grpcBuckets)),
		),
		jobs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "jobs",
			Help: "Jobs known to the coordinator, by state.",
		}, []string{"state"}),
		stepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "step_duration_seconds",
			Help:    "Wall time of one training step on one rank, from batch to updated parameters.",
			Buckets: stepBuckets,
		}),
		imagesPerSecond: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "images_per_second",
			Help: "Training throughput of one rank of a job, in images per second.",
		}, []string{"job", "rank"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "peer_sent_bytes_total",
			Help: "Bytes of gradient and parameter frames sent to a peer (worker or aggregator shard).",
		}, []string{"job", "peer"}),
		receivedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "peer_received_bytes_total",
			Help: "Bytes of gradient and parameter frames received from a peer (worker or aggregator shard).",
		}, []string{"job", "peer"}),
		compressionRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "compression_ratio",
			Help: "Uncompressed gradient bytes divided by bytes on the wire, for a job's latest step (1 without compression).",
		}, []string{"job"}),
		gradRawBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "gradient_raw_bytes_total",
			Help: "Gradient bytes before compression (4 per float32 value) a job's ranks reduced on this process.",
		}, []string{"job"}),
		gradSentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "gradient_sent_bytes_total",
			Help: "Gradient message bytes after compression a job's ranks contributed on this process (raw/sent is the compression ratio).",
		}, []string{"job"}),
		compressSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "compress_seconds_total",
			Help: "Seconds a job's ranks on this process spent compressing and decompressing gradients (outside collectives).",
		}, []string{"job"}),
		collectiveSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "collective_duration_seconds",
			Help:    "Latency of one collective operation (all_reduce, broadcast, push, pull, ...).",
			Buckets: collectiveBuckets,
		}, []string{"op"}),
		heartbeatsMissed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "heartbeats_missed_total",
			Help: "Worker heartbeats that did not arrive in time.",
		}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "recoveries_total",
			Help: "Times a job recovered from a lost worker (new generation or restart from checkpoint).",
		}),
		nonFiniteSkips: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "nonfinite_steps_skipped_total",
			Help: "Training steps skipped because the reduced gradient held NaN or Inf.",
		}),
		stragglerDelay: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "straggler_delay_seconds",
			Help: "Seconds by which a rank the coordinator reports as a straggler delays each step of its job (0 once it keeps up again).",
		}, []string{"job", "rank"}),
		stragglers: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "stragglers_total",
			Help: "Straggler episodes reported: a rank found clearly slower than the others of its job.",
		}),
		states: map[string]bool{}, seen: map[string]CompressionTotals{},
	}
	r.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		r.grpc,
		r.jobs, r.stepSeconds, r.imagesPerSecond, r.sentBytes, r.receivedBytes,
		r.compressionRatio, r.gradRawBytes, r.gradSentBytes, r.compressSeconds, r.collectiveSeconds, r.heartbeatsMissed, r.recoveries, r.nonFiniteSkips,
		r.stragglerDelay, r.stragglers,
	)
	for _, s := range JobStates {
		r.jobs.WithLabelValues(s).Set(0)
		r.states[s] = true
	}
	return r
}

// Prometheus is the underlying registry, for gathering in tests or adding
// collectors that have no method here.
func (r *Registry) Prometheus() *prometheus.Registry {
	if r == nil {
		return nil
	}
	return r.reg
}

// SetJobCounts sets the number of jobs in each state. States exported
// before and missing from counts drop to zero, so a caller may pass only
// the states it has jobs in.
func (r *Registry) SetJobCounts(counts map[string]int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.states {
		if _, ok := counts[s]; !ok {
			r.jobs.WithLabelValues(s).Set(0)
		}
	}
	for s, n := range counts {
		r.states[s] = true
		r.jobs.WithLabelValues(s).Set(float64(n))
	}
}

// ObserveStep records the duration of one training step.
func (r *Registry) ObserveStep(d time.Duration) {
	if r == nil {
		return
	}
	r.stepSeconds.Observe(d.Seconds())
}

// SetImagesPerSecond sets the throughput of one rank of a job.
func (r *Registry) SetImagesPerSecond(job string, rank int, v float64) {
	if r == nil {
		return
	}
	r.imagesPerSecond.WithLabelValues(job, strconv.Itoa(rank)).Set(v)
}

// AddBytesSent counts n bytes sent to peer for job. Non-positive n is
// ignored.
func (r *Registry) AddBytesSent(job, peer string, n int) {
	if r == nil || n <= 0 {
		return
	}
	r.sentBytes.WithLabelValues(job, peer).Add(float64(n))
}

// AddBytesReceived counts n bytes received from peer for job.
// Non-positive n is ignored.
func (r *Registry) AddBytesReceived(job, peer string, n int) {
	if r == nil || n <= 0 {
		return
	}
	r.receivedBytes.WithLabelValues(job, peer).Add(float64(n))
}

// ObserveCompression publishes a job's cumulative compression counters on
// this process (t only grows while the job runs): the ratio gauge and the
// raw bytes, sent bytes and compression seconds counters, advanced by what
// is new since the last call for the job.
func (r *Registry) ObserveCompression(job string, t CompressionTotals) {
	if r == nil || t.SentBytes <= 0 {
		return
	}
	r.mu.Lock()
	last := r.seen[job]
	r.seen[job] = t
	r.mu.Unlock()
	r.compressionRatio.WithLabelValues(job).Set(float64(t.RawBytes) / float64(t.SentBytes))
	if d := t.RawBytes - last.RawBytes; d > 0 {
		r.gradRawBytes.WithLabelValues(job).Add(float64(d))
	}
	if d := t.SentBytes - last.SentBytes; d > 0 {
		r.gradSentBytes.WithLabelValues(job).Add(float64(d))
	}
	if d := t.Seconds - last.Seconds; d > 0 {
		r.compressSeconds.WithLabelValues(job).Add(d)
	}
}

// ObserveCollective records the latency of one collective operation, op
// naming it ("all_reduce", "reduce_scatter", "all_gather", "push", "pull").
func (r *Registry) ObserveCollective(op string, d time.Duration) {
	if r == nil {
		return
	}
	r.collectiveSeconds.WithLabelValues(op).Observe(d.Seconds())
}

// HeartbeatMissed counts one missed worker heartbeat.
func (r *Registry) HeartbeatMissed() {
	if r != nil {
		r.heartbeatsMissed.Inc()
	}
}

// Recovered counts one recovery of a job from a lost worker.
func (r *Registry) Recovered() {
	if r != nil {
		r.recoveries.Inc()
	}
}

// NonFiniteStepSkipped counts one step skipped for a NaN or Inf gradient.
func (r *Registry) NonFiniteStepSkipped() {
	if r != nil {
		r.nonFiniteSkips.Inc()
	}
}

// SetStragglerDelay sets by how much a rank of a job delays each step: a
// positive delay while it is reported as a straggler, 0 once it keeps up.
func (r *Registry) SetStragglerDelay(job string, rank int, seconds float64) {
	if r == nil {
		return
	}
	r.stragglerDelay.WithLabelValues(job, strconv.Itoa(rank)).Set(seconds)
}

// StragglerFound counts one straggler episode.
func (r *Registry) StragglerFound() {
	if r != nil {
		r.stragglers.Inc()
	}
}

// ForgetJob removes a finished job's per-job series (throughput, bytes per
// peer, compression ratio), so that label sets do not pile up on a
// long-running coordinator or worker.
func (r *Registry) ForgetJob(job string) {
	if r == nil {
		return
	}
	l := prometheus.Labels{"job": job}
	r.imagesPerSecond.DeletePartialMatch(l)
	r.sentBytes.DeletePartialMatch(l)
	r.receivedBytes.DeletePartialMatch(l)
	r.compressionRatio.DeletePartialMatch(l)
	r.gradRawBytes.DeletePartialMatch(l)
	r.gradSentBytes.DeletePartialMatch(l)
	r.compressSeconds.DeletePartialMatch(l)
	r.mu.Lock()
	delete(r.seen, job)
	r.mu.Unlock()
	r.stragglerDelay.DeletePartialMatch(l)
}

// UnaryServerInterceptor records gRPC server metrics (started, handled by
// code, handling time) for unary RPCs.
func (r *Registry) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	if r == nil {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}
	}
	return r.grpc.UnaryServerInterceptor()
}

// StreamServerInterceptor records gRPC server metrics (started, handled by
// code, messages sent and received, handling time) for streaming RPCs.
func (r *Registry) StreamServerInterceptor() grpc.StreamServerInterceptor {
	if r == nil {
		return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, ss)
		}
	}
	return r.grpc.StreamServerInterceptor()
}

// GRPCServerOptions are server options that chain both interceptors. They
// compose with other grpc.ChainUnaryInterceptor options; put them first so
// the handling time includes the other interceptors (auth, logging).
func (r *Registry) GRPCServerOptions() []grpc.ServerOption {
	if r == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(r.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(r.StreamServerInterceptor()),
	}
}

// ServiceInfoProvider is what InitializeGRPC needs of a server;
// *grpc.Server is one.
type ServiceInfoProvider interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}

// InitializeGRPC exports every method registered on s with zero counts.
// Call it after registering services and before Serve.
func (r *Registry) InitializeGRPC(s ServiceInfoProvider) {
	if r == nil {
		return
	}
	r.grpc.InitializeMetrics(s)
}
