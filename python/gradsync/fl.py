"""Federated clients in PyTorch (or anything over numpy): gradsync's Flower-style client API.

A fedavg entrypoint job runs one client per worker (client index = the worker's rank)::

    gradsync local --workers 3 --mode fedavg --fraction 1 --rounds 5 \\
        --entrypoint 'python3 examples/torch_fl_client.py'

Each worker starts the script, which defines a :class:`Client` and calls :func:`start`::

    import gradsync.fl as fl

    class MyClient(fl.Client):
        def get_parameters(self, config):
            return [p.detach().numpy() for p in model.parameters()]

        def fit(self, parameters, config):
            load(model, parameters); train(model, epochs=config["local_epochs"], lr=config["lr"])
            return self.get_parameters({}), num_train_examples, {"loss": last_loss}

        def evaluate(self, parameters, config):
            load(model, parameters); loss, accuracy = test(model)
            return loss, num_test_examples, {"accuracy": accuracy}

    fl.start(MyClient())

What happens:

- ``start`` joins: it sends the client's ``get_parameters({})`` — their layout (names and shapes,
  float32) and initial values — to its worker, which joins the coordinator's rounds with them. The
  global model starts from the initial parameters of the lowest-index client that joined before
  the first round (client 0's when all join in time, as Flower takes one client's); every
  client's layout must equal it, else the join is refused (InvalidArgument) naming the tensor.
  Seed your model the same way on every client if the initial values should not depend on who
  joined first.
- Each round the client is sampled for, ``fit(parameters, config)`` gets the global parameters
  (a list of float32 numpy arrays in the layout's order and shapes) and returns
  ``(parameters, num_examples, metrics)``. The worker sends the difference to the global model;
  the server averages the clients' updates weighted by ``num_examples`` (or uniformly, with
  ``federated.weighting: uniform``) and applies the job's strategy (fedavg, fedavgm, fedadam,
  fedyogi, fedprox, median, trimmed-mean) and server learning rate. ``config`` holds the round's
  ``round``, ``local_epochs``, ``batch_size`` (0: the whole local data set), ``lr`` (the job's
  client_lr), ``mu`` (FedProx's proximal coefficient, 0 without: the script applies it) and
  ``deadline_seconds`` (answer within it). ``metrics["loss"]``, if given, is recorded as the
  client's training loss of the round.
- The evaluator (the connected client with the lowest index) gets ``evaluate(parameters, config)``
  of the global model after each evaluated round and returns ``(loss, num_examples, metrics)``;
  ``metrics["accuracy"]`` (in [0, 1]) is required: it is the job's test accuracy, recorded as Go
  clients' evaluations are (metrics.jsonl, the job's result). The other metrics (numbers) of fit
  and evaluate go to the run log as ``client_metrics`` records.
- Everything the script's parameters hold is averaged as a parameter, batch-norm running
  statistics included if ``get_parameters`` returns them (as in Flower); integer tensors are sent
  as float32 and given back to ``fit`` and ``evaluate`` as float32.
- A script that raises, exits, or does not answer within the round deadline is stopped, and its
  client leaves the job: it is missing from the rounds it is sampled for, as a lost worker's
  client is, named with its stderr in the job's events; the job fails only when every client is
  gone. Scripts have the longer of the round deadline and the step timeout (default 60 s) to
  start and join; a script that fails before it joins fails the job.

Parameters move through the worker's agent socket in chunks of at most 4 MiB; no message holds a
whole model. Needs numpy, grpcio and protobuf (Debian: python3-numpy, python3-grpcio,
python3-protobuf); not torch.
"""

import os
import sys
import traceback

import grpc
import numpy as np

from gradsync.client import ENV_AGENT, AgentError, _MAX_MESSAGE
from gradsync.v1 import agent_pb2, agent_pb2_grpc

__all__ = ["Client", "start", "FederatedError"]

_FIT = agent_pb2.FED_TASK_KIND_FIT
_EVALUATE = agent_pb2.FED_TASK_KIND_EVALUATE
_DONE = agent_pb2.FED_TASK_KIND_DONE
_NONE = agent_pb2.FED_TASK_KIND_NONE

# Config values that are counts: given to fit and evaluate as ints.
_INT_CONFIG = ("round", "local_epochs", "batch_size")


class FederatedError(RuntimeError):
    """A client broke the federated protocol (a bad return value, a layout that changed)."""


class Client:
    """A federated client over numpy arrays, as Flower's NumPyClient.

    Subclasses implement ``get_parameters``, ``fit`` and ``evaluate``; :func:`start` calls them.
    Parameters are lists of numpy arrays, the same number, order and shapes on every call and
    every client.
    """

    def get_parameters(self, config):
        """Returns this client's parameters: a list of numpy arrays (sent as float32)."""
        raise NotImplementedError("gradsync.fl.Client.get_parameters")

    def parameter_names(self):
        """Optional names of the parameters, in order (as in a state_dict); default param.0, …"""
        return None

    def fit(self, parameters, config):
        """Trains from ``parameters`` (the global model) and returns
        ``(parameters, num_examples, metrics)``: the new parameters, the number of local training
        examples (the weight of this update in FedAvg) and a dict of numbers."""
        raise NotImplementedError("gradsync.fl.Client.fit")

    def evaluate(self, parameters, config):
        """Evaluates ``parameters`` on this client's test data and returns
        ``(loss, num_examples, metrics)``; ``metrics["accuracy"]`` in [0, 1] is required."""
        raise NotImplementedError("gradsync.fl.Client.evaluate")


def _as_f32(arrays, what):
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise FederatedError(f"{what} must be a non-empty list of numpy arrays; got {type(arrays).__name__}")
    return [np.ascontiguousarray(np.asarray(a), dtype="<f4") for a in arrays]


def _chunks(arrays, max_elements):
    """Yields the arrays' values, one after another, as little-endian float32 bytes of at most
    max_elements values each."""
    for a in arrays:
        flat = a.reshape(-1)
        for off in range(0, flat.size, max_elements):
            yield flat[off:off + max_elements].tobytes()


def _metrics(m, what):
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise FederatedError(f"{what}: metrics must be a dict of numbers; got {type(m).__name__}")
    out = {}
    for k, v in m.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise FederatedError(f"{what}: metric {k!r} is {v!r}, not a number") from None
    return out


class _Session:
    """The script's connection to its worker's FedAgent service."""

    def __init__(self, path):
        self._channel = grpc.insecure_channel(
            "unix:" + path,
            options=[("grpc.max_send_message_length", _MAX_MESSAGE),
                     ("grpc.max_receive_message_length", _MAX_MESSAGE)])
        self._stub = agent_pb2_grpc.FedAgentStub(self._channel)
        self.max_elements = 1 << 20
        self.shapes = None

    def close(self):
        self._channel.close()

    def join(self, names, arrays):
        self.shapes = [a.shape for a in arrays]
        tensors = [agent_pb2.TensorInfo(name=n, shape=list(a.shape), dtype="float32") for n, a in zip(names, arrays)]

        def requests():
            yield agent_pb2.FedAgentJoinRequest(tensors=tensors)
            for b in _chunks(arrays, self.max_elements):
                yield agent_pb2.FedAgentJoinRequest(data=b)

        try:
            res = self._stub.Join(requests(), timeout=300)
        except grpc.RpcError as e:
            raise AgentError("join", e) from None
        self.max_elements = res.max_elements or self.max_elements
        return res

    def next(self, wait=30.0):
        """The next task: (kind, round, config, parameters or None, message)."""
        try:
            stream = self._stub.Next(agent_pb2.FedAgentNextRequest(wait_seconds=wait), timeout=wait + 300)
            head = next(stream)
            if head.kind not in (_FIT, _EVALUATE):
                return head.kind, head.round, {}, None, head.message
            flat = np.empty(head.num_elements, dtype=np.float32)
            got = 0
            for m in stream:
                v = np.frombuffer(m.data, dtype="<f4")
                if got + v.size > flat.size:
                    raise FederatedError(f"more parameter values than the {flat.size} announced")
                flat[got:got + v.size] = v
                got += v.size
        except grpc.RpcError as e:
            raise AgentError("next", e) from None
        if got != flat.size:
            raise FederatedError(f"{got} parameter values of the {flat.size} announced")
        params, off = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape, dtype=np.int64))
            params.append(flat[off:off + n].reshape(shape))
            off += n
        config = {k: (int(v) if k in _INT_CONFIG else v) for k, v in head.config.items()}
        return head.kind, head.round, config, params, head.message

    def result(self, kind, round_, num_examples, loss, accuracy, metrics, arrays=None):
        def requests():
            yield agent_pb2.FedAgentResultRequest(kind=kind, round=round_, num_examples=num_examples, loss=loss,
                                                  accuracy=accuracy, metrics=metrics)
            if arrays is not None:
                for b in _chunks(arrays, self.max_elements):
                    yield agent_pb2.FedAgentResultRequest(data=b)

        try:
            self._stub.Result(requests(), timeout=300)
        except grpc.RpcError as e:
            raise AgentError("result", e) from None


def _check_fit(out, shapes):
    if not (isinstance(out, tuple) and len(out) == 3):
        raise FederatedError("fit must return (parameters, num_examples, metrics)")
    params, n, metrics = out
    params = _as_f32(params, "fit's parameters")
    if [p.shape for p in params] != shapes:
        raise FederatedError(f"fit returned parameters of shapes {[p.shape for p in params]}; the layout is {shapes}")
    n = int(n)
    if n < 0:
        raise FederatedError(f"fit: num_examples {n} < 0")
    return params, n, _metrics(metrics, "fit")


def _check_evaluate(out):
    if not (isinstance(out, tuple) and len(out) == 3):
        raise FederatedError("evaluate must return (loss, num_examples, metrics)")
    loss, n, metrics = out
    metrics = _metrics(metrics, "evaluate")
    acc = metrics.get("accuracy")
    if acc is None or not 0 <= acc <= 1:
        raise FederatedError(f"evaluate: metrics['accuracy'] must be in [0, 1] (the job's test accuracy); got {acc!r}")
    return float(loss), int(n), acc, metrics


def start(client, path=None):
    """Runs ``client`` as this worker's federated client until the job's rounds are over.

    Joins with ``client.get_parameters({})``, then fits and evaluates what the worker hands it.
    Returns the worker's closing message. An exception in the client's methods is printed and
    the process exits with status 1 (its client then leaves the job).
    """
    path = path or os.environ.get(ENV_AGENT)
    if not path:
        raise RuntimeError(f"gradsync.fl: ${ENV_AGENT} is not set: this script must be started by a gradsync worker "
                           "(gradsync local/submit --mode fedavg --entrypoint '...')")
    s = _Session(path)
    try:
        initial = _as_f32(client.get_parameters({}), "get_parameters")
        names = client.parameter_names() or [f"param.{i}" for i in range(len(initial))]
        if len(names) != len(initial):
            raise FederatedError(f"{len(names)} parameter names for {len(initial)} parameters")
        s.join(list(names), initial)
        while True:
            kind, rnd, config, params, message = s.next()
            if kind == _NONE:
                continue
            if kind == _DONE:
                return message
            if kind == _FIT:
                new, n, metrics = _check_fit(client.fit(params, config), s.shapes)
                s.result(_FIT, rnd, n, float(metrics.get("loss", 0.0)), 0.0, metrics, new)
            elif kind == _EVALUATE:
                loss, n, acc, metrics = _check_evaluate(client.evaluate(params, config))
                s.result(_EVALUATE, rnd, n, loss, acc, metrics)
            else:
                raise FederatedError(f"unknown task kind {kind}")
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    finally:
        s.close()
