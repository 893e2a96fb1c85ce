// Package compress holds gradient reducers for ring mode: the plain
// all-reduce and the compressors that wrap it (PowerSGD, top-k, int8,
// fp16/bf16). A Reducer turns this rank's flat gradient into the average
// over all ranks, in place (callers no longer divide by the world size),
// using only aggregator's collectives over an aggregator.Ring, and leaves
// every rank with bit-identical bits. New builds one from a Scheme, the
// type and its Go configuration; the package knows nothing of the wire or
// the job spec: jobspec.CompressionScheme maps a job's CompressionSpec
// (its knobs, their defaults and checks below) to a Scheme, and the
// parameter-server frames (PSFrame) are mapped to the wire by
// paramserver/psstep.
//
// # The state machine of one Reduce(grads, step)
//
// Every compressor has a start step (start_iter). Steps before it run the
// fallback, Plain: one ring all-reduce per bucket (the worker's DDP-style
// buckets, last layer first) and ×1/n, exactly as ring mode always did.
// From start_iter on:
//
// PowerSGD (Vogels et al. 2019; PyTorch's powerSGD_hook). At construction
// every segment of two or more dimensions is viewed as a matrix [rows =
// shape[0], cols = the rest] (a conv weight [out,in,kh,kw] as
// [out, in·kh·kw]) with rank r' = min(rows, cols, r), and compressed only if
// (rows+cols)·r'·min_compression_rate < rows·cols; 1-D tensors and small
// matrices are not. Then, per step:
//
//  1. Error feedback: Δ = grad + residual for each compressed matrix.
//  2. Q (cols×r') is the last step's (warm start) or, on the first
//     compressed step or without warm start, drawn N(0,1) from a PCG stream
//     keyed by (seed, segment index[, step]) — identical on every rank — and
//     orthonormalised.
//  3. P = Δ·Q for each matrix; ONE all-reduce (sum) carries every P followed
//     by every uncompressed tensor; the uncompressed part is ×1/n and
//     written back.
//  4. Each P is orthonormalised (Gram-Schmidt in float64, twice, column
//     norm + epsilon; a zero column stays zero); Q = Δᵀ·P.
//  5. ONE all-reduce carries every Q; Q ×1/n. The gradient becomes P·Qᵀ and
//     the residual Δ − P·Qᵀ; Q is kept for the next step.
//
// Top-k: w = grad + residual; each rank takes its k = max(1, ⌊ratio·n⌋)
// entries of largest |w| (ties: lower index; radix select, O(n)), sends
// them as k (index, value) pairs — the int32 index carried bit-exactly as
// a float32 word — in one all-gather, and every rank sums all pairs in
// rank order and multiplies by 1/n. The residual is w with the sent
// entries zeroed.
//
// Int8 (QSGD-style): per chunk of 512 elements a float32 scale s =
// max|x|; each x becomes sign(x)·l with l ∈ [0,127] the stochastic
// rounding of |x|·127/s (up with probability equal to the fractional part:
// unbiased), drawn from a PCG stream keyed by (seed, rank, step). The
// message (scales, then four int8 per float32 word) is all-gathered and
// every rank dequantises and sums in rank order, then ×1/n.
//
// FP16/BF16: each element rounded to nearest, ties to even (fp16
// overflows to ±Inf above 65504); two halves per word are all-gathered and
// summed in float32 in rank order, then ×1/n.
//
// All sums over ranks are either the ring all-reduce's (computed once,
// then copied) or local sums over all-gathered data in rank order, so the
// ranks end bit-identical.
//
// # Knobs and defaults
//
//	spec field            applies to       default        PyTorch
//	rank                  powersgd         2              1 (matrix_approximation_rank)
//	start_iter            all              10 (powersgd)  1000 (start_powerSGD_iter)
//	                                       0 (others)
//	min_compression_rate  powersgd         2              2
//	error_feedback        powersgd, topk   true           true (use_error_feedback)
//	warm_start            powersgd         true           true
//	ratio                 topk             0.01           —
//
// gradsync's jobs are short, so PowerSGD starts after 10 plain steps
// rather than 1000, and uses rank 2 rather than 1 (on the cnn model that
// is still a 60× compression). A negative start_iter compresses from
// step 0. Knobs that do
// not apply to the type are errors. These are the job spec's conventions,
// applied by jobspec.CompressionScheme. The Go configs (PowerSGDConfig, …) are
// usable as zero values and take StartIter literally. Orthogonalisation
// epsilon is 0, as in PyTorch.
//
// Deviations from powerSGD_hook, deliberate: the whole gradient is one
// "bucket" (P and Q of all matrices each go in one all-reduce, and the
// uncompressed tensors ride with P, so a step costs two collectives);
// the residual is kept only for compressed matrices (PyTorch's bucket-wide
// residual holds local − mean for uncompressed tensors, which averages to
// zero); orthogonalisation is in float64 with re-orthogonalisation, so a
// matrix of rank ≤ r comes back to float32 accuracy.
//
// # State, steps and failures
//
// State()/SetState() (the Stateful interface, implemented by every reducer
// here) expose what a checkpoint must carry: "powersgd.q.<param>" (cols×r)
// and "powersgd.error.<param>" (the parameter's shape), or
// "topk.residual" ([n]). Int8 and the casts are stateless: their
// randomness is a function of (seed, rank, step). The Q matrices are
// identical on every rank (SharedStateName); the residuals are the rank's
// own. FlatLen/CopyState/RestoreState give the same state as two flat
// buffers (Flat: Shared and Own) for copies at every step without
// allocation, as the worker's in-memory snapshots take them.
//
// The k-th collective of Reduce at step s is tagged Frame.Step =
// s<<20 | k, so a frame left over from another step is rejected. If Reduce
// fails, grads are undefined but the reducer's state is unchanged; as with
// any ring failure the ring itself must be rebuilt.
//
// # Bytes
//
// Stats are cumulative: RawBytes (4 per element per call), SentBytes (the
// message this rank contributes: PowerSGD's P, Q and uncompressed tensors;
// top-k's 8 bytes per pair; int8's packed bytes plus scales; 2 bytes per
// element for fp16/bf16; RawBytes for the plain all-reduce), so
// RawBytes/SentBytes is the compression ratio whatever the world size;
// WireBytes (payload bytes actually handed to Ring.SendRight: about
// 2(n−1)/n of the message for the all-reduce schemes, (n−1) times the
// message for the all-gather schemes — so top-k, int8 and fp16 save wire
// bytes over the plain all-reduce only while their ratio exceeds n/2);
// CompressSeconds (time outside collectives).
package compress
