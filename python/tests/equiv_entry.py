"""Run as an entrypoint job's command (see test_gradsync.py): 20 steps of a small CNN
through gradsync's agent, each rank on its share of every batch, must give the parameters
of single-process training on the full batch within 1e-5 relative, and every rank the same
parameters bit for bit. Prints EQUIVALENCE OK and exits 0, or exits 1 saying what differs."""

import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gradsync.torch as gs  # noqa: E402

STEPS, BATCH, TOL = 20, 24, 1e-5


def net():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 16), nn.Tanh(), nn.Linear(16, 10))


def main():
    gs.init()
    rank, size = gs.rank(), gs.size()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = net()
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(STEPS, BATCH, 1, 12, 12, generator=g)
    ys = torch.randint(0, 10, (STEPS, BATCH), generator=g)
    if rank != 0:  # different starting points everywhere but rank 0: broadcast must fix them
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    bucket_mb = float(os.environ.get("EQUIV_BUCKET_MB", "0.002"))  # several buckets
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), bucket_cap_mb=bucket_mb,
                                  shared_memory=os.environ.get("EQUIV_SHM", "1") == "1")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    per = BATCH // size
    for s in range(STEPS):
        x, y = xs[s, rank * per:(rank + 1) * per], ys[s, rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(xs[s]), ys[s]).backward()
        ref_opt.step()
        gs.report(step=s + 1, total_steps=STEPS, loss=float(loss))
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        rel = float((p - q).norm() / q.norm())
        worst = max(worst, rel)
        if not rel <= TOL:
            print(f"rank {rank}: {name} differs from full-batch training by {rel:.3g} relative (> {TOL})",
                  file=sys.stderr)
            return 1
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    root = gs.agent().broadcast(flat, root=0)
    if not np.array_equal(root, flat):
        print(f"rank {rank}: parameters differ from rank 0's", file=sys.stderr)
        return 1
    gs.report(final=True, step=STEPS, epoch=1, test_accuracy=0.0)
    print(f"rank {rank}/{size}: EQUIVALENCE OK: {STEPS} steps, worst relative difference {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
