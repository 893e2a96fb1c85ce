"""A federated client (gradsync.fl) for test_gradsync: a small torch model on a synthetic,
learnable set, one unequal shard per client (client k holds 40·(k+1) examples).

It writes what it fits and evaluates to $FL_DUMP_DIR (fit-<round>-<client>.npz: the parameters it
was given, those it returned and its num_examples; eval-<round>.npz: the global model it was given
and its accuracy), so that the test can check the server's aggregation. With $FL_CRASH_CLIENT and
$FL_CRASH_ROUND set, that client crashes in that round's fit.
"""

import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gradsync.fl as fl  # noqa: E402

RANK = int(os.environ["RANK"])
DUMP = os.environ["FL_DUMP_DIR"]
CRASH = (int(os.environ.get("FL_CRASH_CLIENT", "-1")), int(os.environ.get("FL_CRASH_ROUND", "-1")))

torch.manual_seed(0)  # every client builds the same initial model
torch.set_num_threads(1)


def dataset(n, seed):
    """Two-class blobs in 16 dimensions: class means ±1 along a fixed direction, plus noise."""
    g = np.random.default_rng(seed)
    y = g.integers(0, 2, n)
    x = (g.normal(0, 1.0, (n, 16)) + (2 * y[:, None] - 1) * 0.35).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


X, Y = dataset(40 * (RANK + 1), 100 + RANK)
XT, YT = dataset(400, 7)
model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))


def load(params):
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(torch.from_numpy(v))


class TestClient(fl.Client):
    def get_parameters(self, config):
        return [p.detach().numpy().copy() for p in model.parameters()]

    def parameter_names(self):
        return [n for n, _ in model.named_parameters()]

    def fit(self, parameters, config):
        rnd = config["round"]
        if (RANK, rnd) == CRASH:
            print(f"client {RANK}: crash on purpose in round {rnd}", file=sys.stderr, flush=True)
            os._exit(3)
        load(parameters)
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
        bs = config["batch_size"] or len(X)
        for _ in range(config["local_epochs"]):
            for i in range(0, len(X), bs):
                opt.zero_grad()
                loss = F.cross_entropy(model(X[i:i + bs]), Y[i:i + bs])
                loss.backward()
                opt.step()
        out = self.get_parameters({})
        np.savez(os.path.join(DUMP, f"fit-{rnd}-{RANK}.npz"), n=len(X), *parameters, *out)
        return out, len(X), {"loss": float(loss)}

    def evaluate(self, parameters, config):
        load(parameters)
        with torch.no_grad():
            logits = model(XT)
            loss = float(F.cross_entropy(logits, YT))
            acc = float((logits.argmax(1) == YT).float().mean())
        np.savez(os.path.join(DUMP, f"eval-{config['round']}.npz"), acc=acc, *parameters)
        return loss, len(XT), {"accuracy": acc}


print(f"client {RANK}: {fl.start(TestClient())}", flush=True)
