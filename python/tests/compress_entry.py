"""Run as an entrypoint job's command with the job's --compress (see test_gradsync.py): a few
steps of a small CNN through gradsync's agent, its gradient buckets compressed by the worker.
Every rank must end with the same parameters bit for bit, the loss must go down, and
gradsync.torch.compression() must name the job's compression ($COMPRESS_WANT). Prints
COMPRESS OK and exits 0, or exits 1 saying what is wrong."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gradsync.torch as gs  # noqa: E402
from entry_checks import exit_unless_ranks_agree  # noqa: E402

STEPS, BATCH = 24, 32


def net():
    # conv and linear weights (compressed by PowerSGD), biases (sent as they are); several buckets.
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 5 * 5, 32), nn.ReLU(), nn.Linear(32, 10))


def main():
    gs.init()
    rank, size = gs.rank(), gs.size()
    want = os.environ.get("COMPRESS_WANT", "")
    if gs.compression() != want:
        print(f"compression() is {gs.compression()!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = net()
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), bucket_cap_mb=0.01)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, 1, 12, 12, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    per = BATCH // size
    xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        with torch.no_grad():
            losses.append(float(loss_fn(model(x), y)))  # the full batch's loss, the same on every rank
        gs.report(step=s + 1, total_steps=STEPS, loss=losses[-1])
    exit_unless_ranks_agree(model, rank)
    if not losses[-1] < 0.7 * losses[0]:
        print(f"rank {rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f}: it did not go down", file=sys.stderr)
        sys.exit(1)
    print(f"rank {rank}: COMPRESS OK ({gs.compression()}): loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    gs.report(final=True, step=STEPS, test_accuracy=0.0)


if __name__ == "__main__":
    main()
