"""The agent service of the local gradsync worker, over numpy arrays.

Every collective carries a sequence number: this client numbers its calls
0, 1, 2, ... in the order they are made (under a lock), and the worker runs
them in that order, so several may be in flight at once. Every rank must
make the same collective calls in the same order.
"""

import mmap
import os
import socket
import struct
import threading

import grpc
import numpy as np

from gradsync.v1 import agent_pb2, agent_pb2_grpc

ENV_AGENT = "GRADSYNC_AGENT"
_BELL_NAME = "agent.bell"  # agent.BellName, beside the agent's socket

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


class _Status:
    """A bell reply's status, shaped as grpc.RpcError's code() and details() for AgentError."""

    def __init__(self, code, details):
        self._code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details


class _Bell:
    """The agent's bell (agent/bell.go): all-reduces of shared-memory ranges as 32-byte requests on
    a Unix socket, and 24-byte replies (plus an error message), instead of a gRPC call each.

    Replies come as the collectives end, in any order. Whoever waits for one reads the socket
    (no thread of its own) until it comes, keeping the others' for them; once a caller wants a
    callback (add_done_callback), a reader thread takes over, so that callbacks run without
    anyone waiting."""

    _REQ = struct.Struct("<IHHqqq")
    _REP = struct.Struct("<IIqII")
    _MAGIC = 0x31425347
    _OP_ALLREDUCE = 1
    _AVERAGE = 1

    def __init__(self, path, timeout):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._cv = threading.Condition()
        self._done = {}  # seq -> (code, message)
        self._callbacks = {}  # seq -> [fn]
        self._reading = False
        self._waiters = 0  # callers in wait() while the reader thread reads for them
        self._thread = None
        self._error = None  # the connection failed: every waiter gets it
        self._buf = bytearray()

    def send(self, seq, offset, length, average):
        # Under the Agent's lock (numbers leave in order).
        self._sock.sendall(self._REQ.pack(self._MAGIC, self._OP_ALLREDUCE, self._AVERAGE if average else 0,
                                          seq, offset, length))

    def _read_exact(self, n):
        while len(self._buf) < n:
            chunk = self._sock.recv(max(4096, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("the worker closed the agent's bell")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_one(self):
        magic, code, seq, n, _ = self._REP.unpack(self._read_exact(self._REP.size))
        if magic != self._MAGIC:
            raise ConnectionError("the agent's bell sent a malformed reply")
        msg = self._read_exact(n).decode("utf-8", "replace") if n else ""
        return seq, code, msg

    def _pump(self):
        """Reads one reply with the condition released; returns with it held. Call holding it."""
        self._reading = True
        self._cv.release()
        try:
            got, err = self._read_one(), None
        except (OSError, ConnectionError) as e:
            got, err = None, e
        finally:
            self._cv.acquire()
            self._reading = False
        fns = []
        if err is not None:
            self._error = _Status(grpc.StatusCode.UNAVAILABLE.value[0], f"the agent's bell failed: {err}")
            fns = [fn for fs in self._callbacks.values() for fn in fs]
            self._callbacks.clear()
        else:
            seq, code, msg = got
            self._done[seq] = (code, msg)
            fns = self._callbacks.pop(seq, [])
        self._cv.notify_all()
        return fns

    def wait(self, seq):
        """Blocks until collective seq's reply; returns None or raises AgentError."""
        fns = []
        with self._cv:
            while seq not in self._done and self._error is None:
                if self._thread is not None:
                    self._waiters += 1
                    self._cv.notify_all()
                    self._cv.wait()
                    self._waiters -= 1
                elif self._reading:
                    self._cv.wait()
                else:
                    fns += self._pump()
            res = self._done.pop(seq, None)
        for fn in fns:
            fn()
        if res is None:
            raise AgentError("all_reduce", self._error)
        code, msg = res
        if code != 0:
            raise AgentError("all_reduce", _Status(code, msg))

    def on_done(self, seq, fn):
        """Calls fn() once seq's reply is in (at once if it is), on the reader thread."""
        with self._cv:
            if seq in self._done or self._error is not None:
                now = True
            else:
                now = False
                self._callbacks.setdefault(seq, []).append(fn)
                self._cv.notify_all()
                if self._thread is None:
                    self._thread = threading.Thread(target=self._reader, name="gradsync-bell", daemon=True)
                    self._thread.start()
        if now:
            fn()

    def _reader(self):
        # Reads only while a callback waits for a reply: an idle socket is no error (the
        # timeout bounds a wait for a reply that is due).
        with self._cv:
            while self._error is None:
                if self._reading or not (self._callbacks or self._waiters):
                    self._cv.wait()
                    continue
                fns = self._pump()
                if fns:
                    self._cv.release()
                    try:
                        for fn in fns:
                            fn()
                    finally:
                        self._cv.acquire()

    def close(self):
        self._sock.close()


class _BellFuture:
    """A bell all-reduce in flight; the same interface as Future."""

    def __init__(self, bell, seq):
        self._bell, self._seq, self._res = bell, seq, None
        self._ended = False

    def result(self):
        if not self._ended:
            try:
                self._bell.wait(self._seq)
            except AgentError as e:
                self._res = e
            self._ended = True
        if self._res is not None:
            raise self._res
        return None

    def add_done_callback(self, fn):
        self._bell.on_done(self._seq, lambda: fn(self))


def _f32(a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return a.tobytes()


def _decode(data):
    return np.frombuffer(data, dtype="<f4").copy()


class Agent:
    """A connection to the worker's agent socket (default $GRADSYNC_AGENT).

    bell: all-reduces of shared-memory ranges go through the agent's bell (see _Bell) where the
    worker has one; False sends them as gRPC calls, as the other calls go."""

    def __init__(self, path=None, bell=True):
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
        # The bell, where the worker has one (older workers do not).
        self._bell = None
        bell_path = os.path.join(os.path.dirname(path), _BELL_NAME)
        if bell and os.path.exists(bell_path):
            try:
                self._bell = _Bell(bell_path, self._timeout)
            except OSError:
                self._bell = None  # the gRPC path serves every call

    def close(self):
        if self._bell is not None:
            self._bell.close()
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
        if self._bell is not None:
            with self._lock:
                seq = self._seq
                self._seq += 1
                try:
                    self._bell.send(seq, offset, length, average)
                except OSError as e:
                    raise AgentError("all_reduce", _Status(grpc.StatusCode.UNAVAILABLE.value[0],
                                                           f"the agent's bell: {e}")) from None
            return _BellFuture(self._bell, seq)
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
