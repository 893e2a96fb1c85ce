"""The agent service of the local gradsync worker, over numpy arrays.

Every collective carries a sequence number: this client numbers its calls
0, 1, 2, ... in the order they are made (under a lock), and the worker runs
them in that order, so several may be in flight at once. Every rank must
make the same collective calls in the same order.
"""

import mmap
import os
import threading

import grpc
import numpy as np

from gradsync.v1 import agent_pb2, agent_pb2_grpc

ENV_AGENT = "GRADSYNC_AGENT"

# Messages carry at most 4 MiB of data (agent.MaxElements float32 values);
# allow some room for the envelope.
_MAX_MESSAGE = (4 << 20) + (64 << 10)


class AgentError(RuntimeError):
    """A call to the worker's agent failed; code is the gRPC status code."""

    def __init__(self, what, err):
        self.code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else str(err)
        name = self.code.name if self.code is not None else "ERROR"
        super().__init__(f"gradsync agent: {what}: {name}: {details}")


class Future:
    """A collective in flight; result() waits for it."""

    def __init__(self, what, fut, decode):
        self._what, self._fut, self._decode = what, fut, decode

    def result(self):
        try:
            return self._decode(self._fut.result())
        except grpc.RpcError as e:
            raise AgentError(self._what, e) from None

    def add_done_callback(self, fn):
        """Calls fn(self) once the call has ended (at once if it has), on a gRPC thread."""
        self._fut.add_done_callback(lambda _: fn(self))


def _f32(a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return a.tobytes()


def _decode(data):
    return np.frombuffer(data, dtype="<f4").copy()


class Agent:
    """A connection to the worker's agent socket (default $GRADSYNC_AGENT)."""

    def __init__(self, path=None):
        path = path or os.environ.get(ENV_AGENT)
        if not path:
            raise RuntimeError(
                f"gradsync: ${ENV_AGENT} is not set: this script must be started by a gradsync worker "
                "(gradsync local/submit --entrypoint '...')")
        self._channel = grpc.insecure_channel(
            "unix:" + path,
            options=[("grpc.max_send_message_length", _MAX_MESSAGE),
                     ("grpc.max_receive_message_length", _MAX_MESSAGE)])
        self._stub = agent_pb2_grpc.AgentStub(self._channel)
        self._lock = threading.Lock()
        self._seq = 0
        self._shm = None
        try:
            info = self._stub.Init(agent_pb2.AgentInitRequest(), timeout=60)
        except grpc.RpcError as e:
            raise AgentError("init", e) from None
        self.job_id = info.job_id
        self.rank = info.rank
        self.size = info.world_size
        self.max_elements = info.max_elements
        # The job's gradient compression: applied by the worker to the all-reduces of
        # shared-memory ranges (gradient buckets); "none" without.
        self.compression = info.compression or "none"
        # A collective may wait for its turn and then for the ring, each
        # bounded by the step timeout on the worker's side.
        self._timeout = 2 * info.step_timeout_seconds + 10

    def close(self):
        self._channel.close()

    def _call(self, what, method, request_fn, decode):
        # The number is taken and the call sent under one lock, so that
        # calls leave in number order.
        with self._lock:
            seq = self._seq
            self._seq += 1
            fut = method.future(request_fn(seq), timeout=self._timeout)
        return Future(what, fut, decode)

    def register_layout(self, tensors, shared_memory=False):
        """tensors: [(name, shape)] of float32 tensors, the same on every rank. Returns the element
        count; with shared_memory, (count, a numpy float32 array mapped on the worker's shared
        region of that size, the tensors one after another)."""
        infos = [agent_pb2.TensorInfo(name=n, shape=list(s), dtype="float32") for n, s in tensors]
        res = self._call("register_layout", self._stub.RegisterLayout,
                         lambda seq: agent_pb2.RegisterLayoutRequest(seq=seq, tensors=infos,
                                                                     shared_memory=shared_memory),
                         lambda r: r).result()
        if not shared_memory:
            return res.num_elements
        with open(res.shm_path, "r+b") as f:
            self._shm = mmap.mmap(f.fileno(), 4 * res.num_elements)  # kept open while mapped
        return res.num_elements, np.frombuffer(self._shm, dtype=np.float32, count=res.num_elements)

    def allreduce_shared_async(self, offset, length, average=True):
        """Starts the all-reduce, in place, of values [offset, offset+length) of the shared region
        (register_layout(..., shared_memory=True)); returns a Future (of None)."""
        rng = agent_pb2.ShmRange(offset=offset, length=length)
        return self._call("all_reduce", self._stub.AllReduce,
                          lambda seq: agent_pb2.AllReduceRequest(seq=seq, shm=rng, average=average),
                          lambda r: None)

    def allreduce_async(self, a, average=True):
        """Starts the sum (or mean) over ranks of a float32 array; returns a Future of the result."""
        data = _f32(a)
        self._check_size(len(data) // 4)
        return self._call("all_reduce", self._stub.AllReduce,
                          lambda seq: agent_pb2.AllReduceRequest(seq=seq, data=data, average=average),
                          lambda r: _decode(r.data))

    def allreduce(self, a, average=True):
        return self.allreduce_async(a, average).result()

    def broadcast(self, a, root=0):
        """Every rank gets root's values of a (a float32 array of the same length everywhere)."""
        data = _f32(a)
        self._check_size(len(data) // 4)
        return self._call("broadcast", self._stub.Broadcast,
                          lambda seq: agent_pb2.BroadcastRequest(seq=seq, root=root, data=data),
                          lambda r: _decode(r.data)).result()

    def barrier(self):
        self._call("barrier", self._stub.Barrier, lambda seq: agent_pb2.BarrierRequest(seq=seq),
                   lambda r: None).result()

    def report(self, **fields):
        """Progress (epoch, step, total_steps, loss, images_per_second, learning_rate), an evaluation
        (eval=True, test_accuracy, test_loss, train_loss) or this rank's final result (final=True)."""
        try:
            self._stub.Report(agent_pb2.ReportRequest(**fields), timeout=60)
        except grpc.RpcError as e:
            raise AgentError("report", e) from None

    def _check_size(self, n):
        if n > self.max_elements:
            raise ValueError(f"gradsync: {n} values in one call; at most {self.max_elements} (split into buckets)")
