"""A federated PyTorch client: a small MNIST CNN trained with FedAvg over gradsync's workers.

    gradsync local --workers 3 --mode fedavg --fraction 1 --rounds 5 --lr 0.05 --local-batch 32 \\
        --entrypoint 'python3 examples/torch_fl_client.py --per-client 2000'

Each worker starts this script as one federated client (client index = RANK): it trains on its
own shard of the training set (--partition iid: a random --per-client examples; shards: McMahan
et al.'s pathological non-IID split, two classes per client) and, when it is the evaluator,
evaluates the global model on --test-examples of the test set. gradsync.fl does the rest: the
worker joins the coordinator's rounds with this client's initial parameters (every client seeds
its model alike), hands each round's global model to fit(), sends the update back, and the
coordinator averages the updates weighted by the clients' example counts.

fit() follows the round's config: local_epochs, batch_size (the job's --local-batch; 0: the
whole shard), lr (the job's --lr) and mu (FedProx's proximal term, with --strategy fedprox).

The data are the MNIST IDX files gradsync itself reads (the GoMNIST Go module's, found in the Go
module cache, or --data-dir), as examples/torch_mnist.py; --data synthetic uses a learnable
synthetic set (class templates plus noise) that needs no files. Needs torch and numpy: Debian's
python3-torch; if the `python3` found first on PATH lacks torch, the script runs itself again
under /usr/bin/python3.
"""

import argparse
import os
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        print(f"torch_fl_client: {sys.executable} has no torch; running under /usr/bin/python3", file=sys.stderr)
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import gradsync.fl as fl  # noqa: E402
from torch_mnist import load, mnist_dir  # noqa: E402  (the same MNIST reader)


class Net(nn.Module):
    """conv5x5(16)-pool-conv5x5(32)-pool-dense128-dense10: about 80 k parameters."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def synthetic(n, seed):
    """A learnable 10-class set of 1×28×28 images: a fixed random template per class plus noise."""
    templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(12345))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return templates[y] + 2.0 * torch.randn(n, 1, 28, 28, generator=g), y


def shard(y, rank, size, per_client, partition, seed):
    """This client's training indices."""
    g = np.random.default_rng(seed)
    if partition == "iid":
        return torch.from_numpy(g.permutation(len(y))[rank * per_client:(rank + 1) * per_client].copy())
    # shards: sort by label, cut into 2·size shards, deal two to each client.
    order = np.argsort(y.numpy(), kind="stable")
    shards = np.array_split(order, 2 * size)
    mine = g.permutation(2 * size)[2 * rank:2 * rank + 2]
    idx = np.concatenate([shards[i] for i in mine])
    return torch.from_numpy(g.permutation(idx)[:per_client].copy())


class MnistClient(fl.Client):
    def __init__(self, model, train, test):
        self.model, (self.x, self.y), (self.xt, self.yt) = model, train, test

    def get_parameters(self, config):
        return [v.detach().cpu().numpy().copy() for v in self.model.state_dict().values()]

    def parameter_names(self):
        return list(self.model.state_dict().keys())

    def _load(self, parameters):
        sd = self.model.state_dict()
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in zip(sd.keys(), parameters)})

    def fit(self, parameters, config):
        self._load(parameters)
        start = [p.detach().clone() for p in self.model.parameters()]
        mu, n = config["mu"], len(self.x)
        bs = config["batch_size"] or n
        opt = torch.optim.SGD(self.model.parameters(), lr=config["lr"])
        g = torch.Generator().manual_seed(1000 * config["round"] + int(os.environ.get("RANK", "0")))
        t0, total = time.time(), 0.0
        self.model.train()
        for _ in range(config["local_epochs"]):
            perm, total = torch.randperm(n, generator=g), 0.0
            for i in range(0, n, bs):
                b = perm[i:i + bs]
                opt.zero_grad()
                loss = F.cross_entropy(self.model(self.x[b]), self.y[b])
                total += float(loss) * len(b)
                if mu > 0:  # FedProx: mu/2 ||w - w_global||^2
                    loss = loss + mu / 2 * sum(((p - s) ** 2).sum() for p, s in zip(self.model.parameters(), start))
                loss.backward()
                opt.step()
        return self.get_parameters({}), n, {"loss": total / n, "seconds": time.time() - t0}

    def evaluate(self, parameters, config):
        self._load(parameters)
        self.model.eval()
        with torch.no_grad():
            out = self.model(self.xt)
            loss = float(F.cross_entropy(out, self.yt))
            acc = float((out.argmax(1) == self.yt).float().mean())
        print(f"torch_fl_client: round {config['round']}: test accuracy {acc:.4f}, loss {loss:.4f}", flush=True)
        return loss, len(self.yt), {"accuracy": acc}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="mnist", choices=("mnist", "synthetic"))
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--partition", default="iid", choices=("iid", "shards"))
    ap.add_argument("--per-client", type=int, default=2000, help="training examples per client")
    ap.add_argument("--test-examples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per client")
    args = ap.parse_args()
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads)
    if args.data == "mnist":
        d = mnist_dir(args.data_dir)
        (x, y), (xt, yt) = load(d, "train"), load(d, "test")
    else:
        (x, y), (xt, yt) = synthetic(6000 * size, args.seed), synthetic(args.test_examples, args.seed + 1)
    idx = shard(y, rank, size, args.per_client, args.partition, args.seed)
    torch.manual_seed(args.seed)  # the same initial model on every client
    client = MnistClient(Net(), (x[idx], y[idx]), (xt[:args.test_examples], yt[:args.test_examples]))
    print(f"torch_fl_client {rank}/{size}: {len(idx)} {args.data} examples, labels "
          f"{np.bincount(y[idx].numpy(), minlength=10).tolist()}", flush=True)
    print(f"torch_fl_client {rank}: {fl.start(client)}", flush=True)


if __name__ == "__main__":
    main()
