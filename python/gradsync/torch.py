"""Horovod-style data parallelism for PyTorch through the local gradsync worker.

    import gradsync.torch as gs
    gs.init()
    model = Net()
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                  named_parameters=model.named_parameters())
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    # shard the data with gs.rank() / gs.size() (torch's DistributedSampler takes them)
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

The gradients are averaged over the ranks bucket by bucket as backward
produces them (through a shared-memory region the worker maps too) (each bucket's all-reduce starts as soon as its last gradient
is accumulated, while backward goes on, as DDP's reducer does); step()
waits for them and then steps the wrapped optimiser. The all-reduce runs in
the Go worker over the job's ring, or, for a job in mode ps (``--mode ps``),
through the coordinator's parameter-server shards, which sum every rank's
bucket and answer the sum to all (the script keeps its own parameters and
optimiser; broadcasts and barriers go through them too). CUDA tensors are copied to host memory
bucket by bucket; the code path is the same on CPU.

Compression is the job's (``gradsync local/submit --compress powersgd:rank=2``; mode ring only):
the worker compresses each bucket with its own state (error feedback, PowerSGD's
warm-start Q) kept between steps; PowerSGD compresses the tensors of two or more
dimensions of a bucket and sends 1-D ones as they are, as PyTorch's powerSGD_hook
does. The script does nothing differently; gradsync.torch.compression() names it.
"""

import io
import os
import threading

import numpy as np
import torch

from gradsync.client import Agent

_agent = None


def init(path=None, bell=True):
    """Connects to the worker's agent ($GRADSYNC_AGENT). Call once, first.

    bell: gradient buckets in shared memory are reduced through the agent's bell (a 32-byte
    request on a Unix socket) instead of a gRPC call each; False is for comparison and
    debugging."""
    global _agent
    if _agent is None:
        _agent = Agent(path, bell=bell)
    return _agent


def _a():
    if _agent is None:
        raise RuntimeError("gradsync.torch: call gradsync.torch.init() first")
    return _agent


def rank():
    return _a().rank


def size():
    return _a().size


def compression():
    """The job's gradient compression: "none", "powersgd", "topk", "int8", "fp16" or "bf16"."""
    return _a().compression


def local_rank():
    import os
    return int(os.environ.get("LOCAL_RANK", "0"))


def agent():
    """The underlying gradsync.client.Agent."""
    return _a()


def report(**fields):
    """Sends progress, an evaluation (eval=True) or the final result (final=True) to the coordinator."""
    _a().report(**fields)


def _tensors(params):
    if hasattr(params, "items"):
        items = list(params.items())
    else:
        items = list(params)
    out = []
    for i, it in enumerate(items):
        if isinstance(it, tuple):
            name, t = it
        else:
            name, t = str(i), it
        if torch.is_tensor(t):
            out.append((name, t))
    return out


def broadcast_parameters(params, root_rank=0):
    """Gives every rank root_rank's values of params (a state_dict, named_parameters() or a list of
    tensors), in place. Floating-point tensors only go through float32 (as gradsync reduces)."""
    a = _a()
    ts = [(n, t) for n, t in _tensors(params) if t.is_floating_point()]
    if not ts:
        return
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for _, t in ts])
        out = np.empty(flat.numel(), dtype=np.float32)
        src = flat.numpy()
        step = a.max_elements
        for off in range(0, flat.numel(), step):
            out[off:off + step] = a.broadcast(src[off:off + step], root=root_rank)
        res = torch.from_numpy(out)
        off = 0
        for _, t in ts:
            n = t.numel()
            t.copy_(res[off:off + n].view_as(t).to(t.device, t.dtype))
            off += n


def _broadcast_bytes(a, payload, root_rank):
    """Every rank gets root_rank's bytes. Over float32 broadcasts: first the length (in 16-bit
    pieces), then the bytes two by two as whole numbers below 65536, which float32 holds
    exactly (no bit pattern is ever taken as a float)."""
    n = np.zeros(4, dtype=np.float32)
    if a.rank == root_rank:
        length = len(payload)
        n[:] = [(length >> s) & 0xFFFF for s in (0, 16, 32, 48)]
    n = a.broadcast(n, root=root_rank)
    length = sum(int(v) << s for v, s in zip(n, (0, 16, 32, 48)))
    words = (length + 1) // 2
    if a.rank == root_rank:
        b = np.frombuffer(payload + b"\0" * (words * 2 - length), dtype="<u2").astype(np.float32)
    else:
        b = np.zeros(words, dtype=np.float32)
    out = np.empty(words, dtype=np.float32)
    step = a.max_elements
    for off in range(0, words, step):
        out[off:off + step] = a.broadcast(b[off:off + step], root=root_rank)
    return out.astype("<u2").tobytes()[:length]


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Gives every rank root_rank's optimiser state, in place: its per-parameter state (Adam's
    moments and step, SGD's momentum buffers, ...) and its param_groups' settings (lr, betas,
    weight decay, ...), exactly, bit for bit (the state_dict travels whole, as torch.save writes
    it). Every rank's optimiser must be over the same parameters in the same order; a rank that
    has not stepped yet gets the state too. Call it after broadcast_parameters when starting or
    resuming, as Horovod's hvd.broadcast_optimizer_state."""
    a = _a()
    opt = getattr(optimizer, "_opt", optimizer)  # a DistributedOptimizer's inner optimiser
    payload = b""
    if a.rank == root_rank:
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        payload = buf.getvalue()
    data = _broadcast_bytes(a, payload, root_rank)
    if a.rank != root_rank:
        sd = torch.load(io.BytesIO(data), map_location="cpu")
        if len(sd["param_groups"]) != len(opt.param_groups) or any(
                len(g["params"]) != len(h["params"]) for g, h in zip(sd["param_groups"], opt.param_groups)):
            raise ValueError("gradsync: broadcast_optimizer_state: rank %d's optimiser has other parameter "
                             "groups than rank %d's" % (a.rank, root_rank))
        opt.load_state_dict(sd)


ENV_CHECKPOINT_DIR = "GRADSYNC_CHECKPOINT_DIR"
ENV_RESUME_FROM = "GRADSYNC_RESUME_FROM"
_SCRIPT_PREFIX, _SCRIPT_SUFFIX = "script-step-", ".pt"  # checkpoint.ScriptPrefix, ScriptSuffix


def checkpoint_dir():
    """The job's checkpoint folder ($GRADSYNC_CHECKPOINT_DIR, under the job's run directory), where
    save_checkpoint(state, step=...) writes; None outside a gradsync ring or ps job."""
    return os.environ.get(ENV_CHECKPOINT_DIR) or None


def _script_checkpoints(d):
    """[(step, path)] of the script checkpoints in folder d, by step."""
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        if not (n.startswith(_SCRIPT_PREFIX) and n.endswith(_SCRIPT_SUFFIX)):
            continue
        mid = n[len(_SCRIPT_PREFIX):-len(_SCRIPT_SUFFIX)]
        if mid.isdigit() and str(int(mid)) == mid and os.path.isfile(os.path.join(d, n)):
            out.append((int(mid), os.path.join(d, n)))
    return sorted(out)


def save_checkpoint(state, path=None, root_rank=0, step=None, keep=3):
    """Saves state (any object torch.save takes: model and optimiser state_dicts, the step, ...) on
    root_rank, atomically: written beside and renamed, so a crash mid-save leaves the previous one
    whole. The other ranks do nothing.

    With step (and no path) it goes into the job's checkpoint store: the job's checkpoint folder
    (checkpoint_dir()) as script-step-<step>.pt, keeping the newest keep there; load_checkpoint()
    finds it after an elastic restart, and in a job resumed with `gradsync submit --resume`.
    With path it goes there. With load_checkpoint, torchrun's contract for elastic jobs: a script
    that gradsync restarts (GRADSYNC_GENERATION above 1, TORCHELASTIC_RESTART_COUNT above 0) goes
    on from the state it saved."""
    store = path is None
    if store:
        if step is None or int(step) < 0:
            raise ValueError("gradsync: save_checkpoint: give step=N (a step ≥ 0) to save into the job's "
                             "checkpoint store, or a path")
        d = checkpoint_dir()
        if d is None:
            raise RuntimeError(f"gradsync: save_checkpoint: ${ENV_CHECKPOINT_DIR} is not set (this job has no "
                               "checkpoint store: a gradsync worker sets it for ring and ps entrypoint jobs); give a path")
        path = os.path.join(d, f"{_SCRIPT_PREFIX}{int(step)}{_SCRIPT_SUFFIX}")
    if _a().rank != root_rank:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if store and keep > 0:
        for _, old in _script_checkpoints(d)[:-keep]:
            try:
                os.remove(old)
            except FileNotFoundError:
                pass


def latest_checkpoint():
    """The path load_checkpoint() loads on this rank: the newest script-step-<N>.pt in the job's
    checkpoint folder (saved before an elastic restart), else the file the job before a resumed one
    saved last ($GRADSYNC_RESUME_FROM), else None."""
    d = checkpoint_dir()
    if d is not None:
        found = _script_checkpoints(d)
        if found:
            return found[-1][1]
    r = os.environ.get(ENV_RESUME_FROM)
    if r and os.path.isfile(r):
        return r
    return None


def load_checkpoint(path=None, root_rank=0):
    """The state save_checkpoint saved, or None where there is none, on every rank: root_rank reads
    the file and broadcasts it, so all ranks go on from the same state even where the file is not
    on a filesystem they share. Without path, the job's checkpoint store (latest_checkpoint(), as
    root_rank sees it). Every rank must call it."""
    a = _a()
    payload = b""
    if a.rank == root_rank:
        if path is None:
            path = latest_checkpoint()
        if path is not None and os.path.exists(path):
            with open(path, "rb") as f:
                payload = f.read()
    data = _broadcast_bytes(a, payload, root_rank)
    if not data:
        return None
    return torch.load(io.BytesIO(data), map_location="cpu")


def init_ddp_process_group():
    """Initialises torch.distributed with a process group of this process alone (gloo, an
    in-memory store), for DDP under gradsync: DDP then communicates nothing itself, and
    comm_hook averages each gradient bucket over gradsync's ranks. As DDP's own broadcast at
    construction then reaches no other rank, call broadcast_parameters(model.state_dict()) too;
    buffers (BatchNorm's running statistics) stay each rank's own."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class HookState:
    """comm_hook's state: which of DDP's buckets it has seen, and the shared-memory region it
    reduces them in once DDP's buckets are final. Give one per DDP model:

        ddp.register_comm_hook(gs.HookState(model), gs.comm_hook)

    model (optional) names the tensors of the layout registered with the worker (the same
    on every rank); without it they are named by bucket and position."""

    def __init__(self, model=None):
        self.names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        self.iteration = 0  # DDP iterations completed (a bucket with is_last() ends one)
        self.seen = {}  # bucket index -> [(name, shape)] in the iteration under way
        self.final = None  # the buckets of the last complete iteration once DDP has rebuilt them
        self.offsets = None  # bucket index -> (offset, length) in the region, once registered
        self.region = None


_default_hook_state = None

# DDP rebuilds its buckets once, after its first iteration: from the second
# on they are final. The hook records the second's, registers them as one
# layout at the start of the third, and from then on reduces each bucket
# in the shared region (where the job's compression applies).
_HOOK_FINAL_ITERATION = 1


def comm_hook(state, bucket):
    """A DDP communication hook that averages a gradient bucket over gradsync's ranks:

        gs.init(); gs.init_ddp_process_group()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        gs.broadcast_parameters(model.state_dict(), root_rank=0)
        ddp.register_comm_hook(gs.HookState(model), gs.comm_hook)

    state: a HookState (None: one shared by every DDP model of the process). DDP hands the
    buckets over in the same order on every rank. In its first two iterations (DDP rebuilds
    its buckets after the first) each bucket goes to the worker through the socket, as it
    is; from the third, once every rank has registered the final buckets as one layout, each
    goes through a shared-memory region the worker maps too, where the job's compression
    (``--compress``) applies to each bucket as to DistributedOptimizer's, with its state kept
    in the worker. The returned future completes with the average while backward goes on.
    float32 buckets only."""
    global _default_hook_state
    if state is None:
        if _default_hook_state is None:
            _default_hook_state = HookState()
        state = _default_hook_state
    a = _a()
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError(f"gradsync.torch.comm_hook reduces float32 buckets; got {buf.dtype}")
    i = bucket.index()
    if state.offsets is None and state.final is not None:
        _register_hook_layout(a, state)
    if state.offsets is None:
        state.seen[i] = [(state.names.get(id(p), f"ddp.bucket{i}.{j}"), tuple(p.shape))
                         for j, p in enumerate(bucket.parameters())]
        if bucket.is_last():
            if state.iteration >= _HOOK_FINAL_ITERATION:
                state.final = [state.seen[k] for k in sorted(state.seen)]
            state.iteration += 1
            state.seen = {}
        return _socket_reduce(a, buf)
    if i not in state.offsets or state.offsets[i][1] != buf.numel():
        raise RuntimeError(f"gradsync.torch.comm_hook: DDP's bucket {i} ({buf.numel()} values) is not one of the "
                           "buckets registered after its second iteration: did DDP rebuild its buckets again?")
    off, n = state.offsets[i]
    torch.from_numpy(state.region[off:off + n]).copy_(buf.detach().reshape(-1).to("cpu"))
    fut = a.allreduce_shared_async(off, n, True)
    out = torch.futures.Future()

    def done(_):
        try:
            fut.result()
            out.set_result(torch.from_numpy(state.region[off:off + n]).clone().view_as(buf).to(buf.device))
        except Exception as e:  # an AgentError: DDP's backward raises it
            out.set_exception(e)

    fut.add_done_callback(done)
    return out


def _register_hook_layout(a, state):
    """Registers the final buckets, in index order, as the layout of a shared region."""
    layout = [t for b in state.final for t in b]
    _, state.region = a.register_layout(layout, shared_memory=True)
    state.offsets, off = {}, 0
    for i, b in enumerate(state.final):
        n = sum(int(np.prod(shape)) for _, shape in b)
        state.offsets[i] = (off, n)
        off += n


def _socket_reduce(a, buf):
    """Averages buf over the ranks through the socket, in pieces of at most max_elements values."""
    src = buf.detach().to("cpu").contiguous().view(-1).numpy()
    n, step = src.size, a.max_elements
    out = torch.futures.Future()
    if n == 0:
        out.set_result(buf)
        return out
    pieces = [(off, a.allreduce_async(src[off:off + step], True)) for off in range(0, n, step)]
    res = np.empty(n, dtype=np.float32)
    left = [len(pieces)]
    lock = threading.Lock()

    def done(_):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            for off, f in pieces:
                res[off:off + step] = f.result()
            out.set_result(torch.from_numpy(res).view_as(buf).to(buf.device))
        except Exception as e:  # an AgentError: DDP's backward raises it
            out.set_exception(e)

    for _, f in pieces:
        f.add_done_callback(done)
    return out


class _Bucket:
    def __init__(self, index, params):
        self.index = index
        self.params = params  # [(name, param)] in the order they are flattened
        self.pending = set(id(p) for _, p in params)
        self.futures = None  # [(offset, n, Future)] once dispatched


class _DistributedOptimizer:
    """Wraps an optimiser; see DistributedOptimizer."""

    def __init__(self, optimizer, named_parameters=None, bucket_cap_mb=4.0, backward_passes_per_step=1,
                 average=True, shared_memory=True):
        self._opt = optimizer
        self._a = _a()
        self._average = average
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._passes = backward_passes_per_step
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [(f"param.{i}", p) for g in optimizer.param_groups for i, p in enumerate(g["params"])]
        named = [(n, p) for n, p in named if p.requires_grad]
        if self._a.compression != "none":
            # The worker compresses the all-reduces of shared-memory ranges only, and they average.
            if not shared_memory:
                raise ValueError(f"gradsync: the job compresses gradients ({self._a.compression}), which needs "
                                 "shared_memory=True in DistributedOptimizer")
            if not average:
                raise ValueError(f"gradsync: the job compresses gradients ({self._a.compression}); compressed "
                                 "all-reduces average: average=False is not available")
        if len({id(p) for _, p in named}) != len(named):
            raise ValueError("named_parameters lists a parameter twice")
        for _, p in named:
            if p.dtype != torch.float32:
                raise TypeError(f"gradsync reduces float32 gradients; got {p.dtype}")
        self._named = named
        # Buckets in reverse parameter order: backward produces the last
        # layers' gradients first.
        cap = max(1, int(bucket_cap_mb * (1 << 20)) // 4)
        self._buckets = []
        cur, size = [], 0
        for n, p in reversed(named):
            if cur and size + p.numel() > cap:
                self._buckets.append(_Bucket(len(self._buckets), cur))
                cur, size = [], 0
            cur.append((n, p))
            size += p.numel()
        if cur:
            self._buckets.append(_Bucket(len(self._buckets), cur))
        self._bucket_of = {id(p): b for b in self._buckets for _, p in b.params}
        self._counts = {id(p): 0 for _, p in named}
        self._next = 0  # the next bucket to dispatch: buckets leave in index order
        # The layout is registered in bucket order, so that each bucket is
        # one range of the shared region.
        layout = [(n, tuple(p.shape)) for b in self._buckets for n, p in b.params]
        self._shm = None
        off = 0
        for b in self._buckets:
            b.offset = off
            off += sum(p.numel() for _, p in b.params)
        if shared_memory:
            _, self._shm = self._a.register_layout(layout, shared_memory=True)
        else:
            self._a.register_layout(layout)
        self._hooks = []
        for _, p in named:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._hooks.append(acc)  # keep the accumulators alive

    # The wrapped optimiser's API.
    @property
    def param_groups(self):
        return self._opt.param_groups

    @property
    def state(self):
        return self._opt.state

    def state_dict(self):
        return self._opt.state_dict()

    def load_state_dict(self, sd):
        return self._opt.load_state_dict(sd)

    def zero_grad(self, set_to_none=False):
        return self._opt.zero_grad(set_to_none=set_to_none)

    def _make_hook(self, p):
        def hook(*_):
            self._counts[id(p)] += 1
            if self._counts[id(p)] < self._passes:
                return
            b = self._bucket_of[id(p)]
            b.pending.discard(id(p))
            self._dispatch_ready()
        return hook

    def _dispatch_ready(self):
        while self._next < len(self._buckets) and not self._buckets[self._next].pending:
            self._dispatch(self._buckets[self._next])
            self._next += 1

    def _dispatch(self, b):
        if self._shm is not None:
            # Each gradient straight into its place in the shared region: one copy.
            off = b.offset
            for _, p in b.params:
                n = p.numel()
                dst = torch.from_numpy(self._shm[off:off + n])
                if p.grad is None:
                    dst.zero_()
                else:
                    dst.copy_(p.grad.detach().reshape(-1))
                if self._passes > 1:
                    dst.div_(self._passes)
                off += n
            n = off - b.offset
            b.futures = [(0, n, self._a.allreduce_shared_async(b.offset, n, self._average))]
            return
        grads = []
        for _, p in b.params:
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            grads.append(g.detach().reshape(-1))
        flat = torch.cat(grads).to("cpu", torch.float32)
        if self._passes > 1:
            flat = flat / self._passes
        src = flat.numpy()
        step = self._a.max_elements
        b.futures = [(off, min(step, src.size - off), self._a.allreduce_async(src[off:off + step], self._average))
                     for off in range(0, src.size, step)]

    def synchronize(self):
        """Waits for every bucket's all-reduce and writes the averaged gradients into .grad."""
        # Buckets whose gradients never came (parameters unused this
        # step) go now, in order, with zeros for the missing ones.
        while self._next < len(self._buckets):
            self._dispatch(self._buckets[self._next])
            self._next += 1
        for b in self._buckets:
            total = sum(p.numel() for _, p in b.params)
            if self._shm is not None:
                b.futures[0][2].result()
                res = torch.from_numpy(self._shm[b.offset:b.offset + total])
            else:
                out = np.empty(total, dtype=np.float32)
                for off, n, fut in b.futures:
                    out[off:off + n] = fut.result()
                res = torch.from_numpy(out)
            off = 0
            for _, p in b.params:
                n = p.numel()
                g = res[off:off + n].view_as(p).to(p.device)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                off += n
            b.futures = None
            b.pending = set(id(p) for _, p in b.params)
        for k in self._counts:
            self._counts[k] = 0
        self._next = 0

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("gradsync.torch.DistributedOptimizer.step does not take a closure")
        self.synchronize()
        return self._opt.step()


def DistributedOptimizer(optimizer, named_parameters=None, bucket_cap_mb=4.0, backward_passes_per_step=1,
                         average=True, shared_memory=True):
    """Wraps optimizer so that step() applies gradients averaged over every rank.

    named_parameters: model.named_parameters() (names go into the layout every rank must share);
    default the optimiser's parameters. bucket_cap_mb: gradients per all-reduce (at most 4 MiB a
    message; larger buckets go as several). backward_passes_per_step: backward passes accumulated
    locally per step (the gradient is their mean). shared_memory: gradients go to the worker through
    a shared-memory region (no copy through the socket); False sends them in the messages.
    Compression is the job's (see the module's documentation); it needs shared_memory=True.
    """
    return _DistributedOptimizer(optimizer, named_parameters, bucket_cap_mb, backward_passes_per_step, average,
                                 shared_memory)
