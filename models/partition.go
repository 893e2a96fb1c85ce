package models

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// This file cuts a Network into pipeline stages (see package pipeline):
// the blocks a cut may fall between, Partition's choice of cuts, and
// ForwardStage/BackwardStage, which run one stage's layers of a whole
// Network so that a split can be checked against the unsplit network.

// Block is a unit a pipeline never cuts: a run of the network's top-level
// layers named by the PyTorch module that holds their parameters — a
// residual block (layer2.0), a transformer block (blocks.1, both its
// attention and its MLP halves), or a single layer (conv1, bn1, fc1, or
// an nn.Sequential index such as 7). Layers without parameters (ReLU,
// pools, dropout, flatten, the class token's selection) belong to the
// block before them, or to the first block when nothing precedes them, so
// a cut always falls just before a layer with parameters.
type Block struct {
	Name string
	// First and End delimit the block's top-level layers [First, End).
	First, End int
	// ParamOffset and ParamLen delimit its elements of Params and Grads;
	// BufferOffset and BufferLen those of Buffers (batch-norm statistics).
	ParamOffset, ParamLen   int
	BufferOffset, BufferLen int
}

// blockName is the block a parameter named name belongs to: its first
// module, with the index that follows when it is a container's (layer3.0,
// blocks.1). A parameter held by the network itself (cls_token) is its
// own name.
func blockName(name string) string {
	parts := strings.Split(name, ".")
	if len(parts) == 1 {
		return name
	}
	parts = parts[:len(parts)-1] // the tensor: weight, bias, running_mean, …
	if len(parts) > 1 {
		if _, err := strconv.Atoi(parts[1]); err == nil {
			return parts[0] + "." + parts[1]
		}
	}
	return parts[0]
}

// Blocks returns the network's blocks in order. Every top-level layer is
// in exactly one; their parameter and buffer ranges are contiguous and in
// order, so a run of blocks owns one contiguous range of each flat buffer.
func (n *Network) Blocks() []Block {
	if n.part != nil {
		return slices.Clone(n.part.blocks)
	}
	return blocksOf(n.name, n.layers, n.segs, n.bufSegs, segmentAddrs(n.params, n.segs), segmentAddrs(n.bufs, n.bufSegs))
}

// blocksOf finds the blocks of layers, whose parameter and buffer views
// are the segments segs and bufSegs; params and bufs map the address of
// each segment's view (its first element) to the segment's index.
func blocksOf(name string, layers []Layer, segs, bufSegs []Segment, params, bufs map[uintptr]int) []Block {
	var blocks []Block
	paramEnd, bufEnd := 0, 0 // where the next layer's parameters and buffers must start
	for i, l := range layers {
		ps, bs := layerSegments(l, params), layerSegments(l, bufs)
		pOff, pLen := segRange(segs, ps)
		bOff, bLen := segRange(bufSegs, bs)
		if pLen > 0 && pOff != paramEnd || bLen > 0 && bOff != bufEnd {
			panic(fmt.Sprintf("models: %s: layer %d's parameters or buffers are not next in the flat buffers", name, i))
		}
		paramEnd, bufEnd = paramEnd+pLen, bufEnd+bLen
		k := len(blocks) - 1
		switch {
		case len(ps) == 0 && k < 0:
			// Leading layers without parameters (Flatten) join the first block.
			if bLen > 0 {
				panic(fmt.Sprintf("models: %s: layer %d has buffers but no parameters", name, i))
			}
		case k >= 0 && (len(ps) == 0 || blocks[k].Name == blockName(segs[ps[0]].Name)):
			blocks[k].End = i + 1
			blocks[k].ParamLen += pLen
			blocks[k].BufferLen += bLen
		default:
			first := i
			if k < 0 {
				first = 0
			}
			blocks = append(blocks, Block{Name: blockName(segs[ps[0]].Name), First: first, End: i + 1,
				ParamOffset: pOff, ParamLen: pLen, BufferOffset: bufEnd - bLen, BufferLen: bLen})
		}
	}
	return blocks
}

// segmentAddrs maps the address of each segment's first element in buf to
// the segment's index.
func segmentAddrs(buf []float32, segs []Segment) map[uintptr]int {
	m := make(map[uintptr]int, len(segs))
	if len(buf) == 0 {
		return m
	}
	base := reflect.ValueOf(buf).Pointer()
	for i, s := range segs {
		if s.Len > 0 {
			m[base+uintptr(s.Offset)*4] = i
		}
	}
	return m
}

// segRange returns the flat range covered by the segments idx (sorted,
// contiguous by construction: a layer's views are declared together).
func segRange(segs []Segment, idx []int) (off, n int) {
	if len(idx) == 0 {
		return 0, 0
	}
	first, last := segs[idx[0]], segs[idx[len(idx)-1]]
	return first.Offset, last.Offset + last.Len - first.Offset
}

// layerSegments returns, sorted, the indices of the segments whose views
// l (or a layer inside it) holds. It walks l's fields read-only, so that
// any layer type, present or future, is covered without a list of types.
func layerSegments(l Layer, addrs map[uintptr]int) []int {
	found := map[int]bool{}
	seen := map[uintptr]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			walk(v.Elem())
		case reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice:
			if v.Type().Elem().Kind() == reflect.Float32 {
				if v.Len() > 0 {
					if i, ok := addrs[v.Pointer()]; ok {
						found[i] = true
					}
				}
				return
			}
			for i := range v.Len() {
				walk(v.Index(i))
			}
		}
	}
	walk(reflect.ValueOf(l))
	idx := slices.Sorted(maps.Keys(found))
	return idx
}

// BalanceBy is what Partition balances when no boundaries are given.
type BalanceBy int

// The balancing criteria.
const (
	ByParams BalanceBy = iota // parameter count per block (the default)
	ByTime                    // Balance.Times, a measured cost per block
)

// Balance says how Partition cuts: at explicit Boundaries, or else so as
// to minimise the largest stage's parameter count or time.
type Balance struct {
	By BalanceBy
	// Times are the cost of each block (len(Blocks()) values, finite and
	// not negative), for ByTime: a layer's time counts in its block.
	Times []float64
	// Boundaries, when set, are the S−1 blocks where stages 1..S−1 start,
	// strictly increasing: a block's name, a module name that starts a
	// block (layer2 for layer2.0), or a block index in [1, blocks). In
	// architectures named by nn.Sequential indices (lenet5, cnn, fedcnn) a
	// number is a module's name, as in PyTorch ("7" is Linear 7), and
	// there are no block indices.
	Boundaries []string
}

// Stage is one pipeline stage of a network: a run of whole blocks.
type Stage struct {
	Blocks []Block
	// First and End delimit the stage's top-level layers [First, End).
	First, End int
	// ParamOffset and ParamLen delimit the stage's part of Params and
	// Grads; BufferOffset and BufferLen its part of Buffers.
	ParamOffset, ParamLen   int
	BufferOffset, BufferLen int
}

func stageOf(blocks []Block) Stage {
	f, l := blocks[0], blocks[len(blocks)-1]
	return Stage{Blocks: blocks, First: f.First, End: l.End,
		ParamOffset: f.ParamOffset, ParamLen: l.ParamOffset + l.ParamLen - f.ParamOffset,
		BufferOffset: f.BufferOffset, BufferLen: l.BufferOffset + l.BufferLen - f.BufferOffset}
}

// PartitionError is a refused partition, naming the job-spec field it
// comes from (parallelism.pipeline.…) as jobspec's FieldError does.
type PartitionError struct {
	Field string
	Msg   string
}

func (e *PartitionError) Error() string { return e.Field + ": " + e.Msg }

func partErr(field, format string, a ...any) *PartitionError {
	return &PartitionError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

const pipelineField = "parallelism.pipeline."

// Partition cuts n into stages contiguous runs of whole blocks. With
// Boundaries it cuts there; otherwise it minimises the largest stage's
// cost — parameter count (ByParams) or Times (ByTime) — exactly, and among
// the cuts that reach that minimum takes the one whose earlier stages are
// as large as possible. Errors are *PartitionError.
func Partition(n *Network, stages int, bal Balance) ([]Stage, error) {
	segs := n.segs
	if n.part != nil {
		segs = n.part.segs
	}
	return partition(n.name, n.Blocks(), segs, stages, bal)
}

// partition is Partition of the blocks of the architecture name, whose
// parameters are the segments segs (the whole network's).
func partition(name string, blocks []Block, segs []Segment, stages int, bal Balance) ([]Stage, error) {
	names := make([]string, len(blocks))
	for i, b := range blocks {
		names[i] = b.Name
	}
	if stages < 1 {
		return nil, partErr(pipelineField+"stages", "must be at least 1, got %d", stages)
	}
	if stages > len(blocks) {
		return nil, partErr(pipelineField+"stages", "%d stages but %s has %d blocks (%s)", stages, name, len(blocks), strings.Join(names, ", "))
	}
	var starts []int // the first block of each stage
	if len(bal.Boundaries) > 0 {
		if bal.By != ByParams || bal.Times != nil {
			return nil, partErr(pipelineField+"boundaries", "boundaries and balance are exclusive")
		}
		var err error
		if starts, err = resolveBoundaries(name, blocks, segs, stages, bal.Boundaries); err != nil {
			return nil, err
		}
	} else {
		cost := make([]float64, len(blocks))
		switch bal.By {
		case ByParams:
			for i, b := range blocks {
				cost[i] = float64(b.ParamLen)
			}
		case ByTime:
			if len(bal.Times) != len(blocks) {
				return nil, partErr(pipelineField+"balance", "%d times for the %d blocks of %s (%s)", len(bal.Times), len(blocks), name, strings.Join(names, ", "))
			}
			for i, t := range bal.Times {
				if math.IsNaN(t) || math.IsInf(t, 0) || t < 0 {
					return nil, partErr(pipelineField+"balance", "time of block %s is %v, want a finite value ≥ 0", names[i], t)
				}
			}
			copy(cost, bal.Times)
		default:
			return nil, partErr(pipelineField+"balance", "unknown balance %d (allowed: params, time)", bal.By)
		}
		starts = balance(cost, stages)
	}
	out := make([]Stage, stages)
	for s, first := range starts {
		end := len(blocks)
		if s+1 < stages {
			end = starts[s+1]
		}
		out[s] = stageOf(blocks[first:end])
	}
	return out, nil
}

// resolveBoundaries turns the S−1 boundaries into the first block of each
// of the S stages.
func resolveBoundaries(arch string, blocks []Block, segs []Segment, stages int, bounds []string) ([]int, error) {
	if len(bounds) != stages-1 {
		return nil, partErr(pipelineField+"boundaries", "%d boundaries for %d stages, want %d", len(bounds), stages, stages-1)
	}
	var allowed []string
	for _, b := range blocks[1:] {
		allowed = append(allowed, b.Name)
	}
	allowedMsg := "allowed: " + strings.Join(allowed, ", ")
	if !sequentialNames(blocks) {
		allowedMsg += fmt.Sprintf(" or an index in [1, %d)", len(blocks))
	}
	starts := []int{0}
	for i, name := range bounds {
		field := fmt.Sprintf("%sboundaries[%d]", pipelineField, i)
		k, err := findBlock(arch, blocks, segs, name)
		if err != nil {
			return nil, partErr(field, "%v; %s", err, allowedMsg)
		}
		if k == 0 {
			return nil, partErr(field, "%q is the first block, where stage 0 starts; %s", name, allowedMsg)
		}
		if prev := starts[len(starts)-1]; k <= prev {
			return nil, partErr(field, "%q (block %d, %s) does not come after the previous boundary (block %d, %s)", name, k, blocks[k].Name, prev, blocks[prev].Name)
		}
		starts = append(starts, k)
	}
	return starts, nil
}

// sequentialNames reports whether the blocks are named by nn.Sequential
// indices (lenet5, cnn, …): there a number is a module's name, as in
// PyTorch, not a block index.
func sequentialNames(blocks []Block) bool {
	_, err := strconv.Atoi(blocks[0].Name)
	return err == nil
}

// findBlock returns the index of the block a boundary names.
func findBlock(arch string, blocks []Block, segs []Segment, name string) (int, error) {
	if k, err := strconv.Atoi(name); err == nil && !sequentialNames(blocks) {
		if k < 0 || k >= len(blocks) {
			return 0, fmt.Errorf("block index %d is out of range", k)
		}
		return k, nil
	}
	for k, b := range blocks {
		if b.Name == name || strings.HasPrefix(b.Name, name+".") {
			return k, nil
		}
	}
	for _, b := range blocks {
		if strings.HasPrefix(name, b.Name+".") {
			for _, s := range segs {
				if strings.HasPrefix(s.Name, name+".") {
					return 0, fmt.Errorf("%q is inside block %s", name, b.Name)
				}
			}
		}
	}
	return 0, fmt.Errorf("%q is not a block boundary of %s", name, arch)
}

// balance returns the first block of each of stages runs of blocks that
// minimise the largest run's cost. The minimum comes from a dynamic
// programme over (stages, blocks); the cut is then filled greedily from
// the front, each stage taking as many blocks as fit under the minimum
// while leaving one per later stage. Sums are always taken left to right
// over a run, in the programme and the greedy fill alike, so their
// comparisons agree exactly.
func balance(cost []float64, stages int) []int {
	nb := len(cost)
	sum := func(from, to int) float64 {
		var t float64
		for _, c := range cost[from:to] {
			t += c
		}
		return t
	}
	// best[k][i]: the least largest cost of i blocks cut into k runs.
	best := make([][]float64, stages+1)
	for k := range best {
		best[k] = make([]float64, nb+1)
		for i := range best[k] {
			best[k][i] = math.Inf(1)
		}
	}
	best[0][0] = 0
	for k := 1; k <= stages; k++ {
		for i := k; i <= nb; i++ {
			for j := k - 1; j < i; j++ {
				best[k][i] = min(best[k][i], max(best[k-1][j], sum(j, i)))
			}
		}
	}
	limit := best[stages][nb]
	starts := make([]int, 0, stages)
	at := 0
	for s := range stages {
		starts = append(starts, at)
		end := at + 1
		for end < nb-(stages-1-s) && sum(at, end+1) <= limit {
			end++
		}
		at = end
	}
	return starts
}

// ForwardStage runs the top-level layers of st on x, the stage's input
// (the network's input for the first stage, the previous stage's output
// otherwise), and returns its output, owned by the layers until their
// next Forward. Running every stage in turn is Forward, bit for bit.
func (n *Network) ForwardStage(st Stage, x []float32, batch int, train bool) []float32 {
	if st.First < 0 || st.End > len(n.layers) || st.First >= st.End {
		panic(fmt.Sprintf("models: %s.ForwardStage: layers [%d, %d) out of [0, %d)", n.name, st.First, st.End, len(n.layers)))
	}
	n.noCheckpointing("ForwardStage")
	if train {
		n.part.holds("ForwardStage in training", st)
	}
	for _, l := range n.layers[st.First:st.End] {
		x = l.Forward(x, batch, train)
	}
	return x
}

// BackwardStage back-propagates dy, the gradient of st's output, through
// st's layers after ForwardStage, adding into their parameter gradients,
// and returns the gradient of st's input (nil for a first stage whose
// first layer skips it). Running every stage in reverse order is
// Backward, bit for bit.
func (n *Network) BackwardStage(st Stage, dy []float32) []float32 {
	if st.First < 0 || st.End > len(n.layers) || st.First >= st.End {
		panic(fmt.Sprintf("models: %s.BackwardStage: layers [%d, %d) out of [0, %d)", n.name, st.First, st.End, len(n.layers)))
	}
	n.noCheckpointing("BackwardStage")
	n.part.holds("BackwardStage", st)
	for i := st.End - 1; i >= st.First && dy != nil; i-- {
		dy = n.layers[i].Backward(dy)
	}
	return dy
}

// Twin returns a second copy of n's layers whose parameter, gradient and
// buffer views point into n's own flat buffers (Params, Grads and Buffers
// are shared: a Backward on either adds into the one gradient buffer, a
// training Forward on either moves the one set of batch-norm statistics)
// but which keeps its own activations. A layer holds only its last
// Forward's activations for Backward, so a pipeline stage that has several
// micro-batches in flight runs each on its own twin. A twin's dropout
// layers keep their own counters (set them with SetDropoutCalls before
// each Forward); it runs on one thread and holds nothing to Close.
func (n *Network) Twin() *Network {
	b := builder{seed: uint64(n.opt.Seed)}
	layers, _ := archs[n.name](&b, n.opt) // no initialiser: the parameters are n's
	if n.part != nil {
		n.part.bind(&b, n.params, n.grads, n.bufs)
	} else {
		b.bind(n.params, n.grads, n.bufs)
	}
	return &Network{name: n.name, opt: n.opt, layers: layers, params: n.params, grads: n.grads, segs: n.segs,
		bufs: n.bufs, bufSegs: n.bufSegs, dropouts: b.dropouts, bns: b.bns, part: n.part}
}
