"""Run as an entrypoint job's command (see test_gradsync.py): 20 steps of a small CNN wrapped in
DDP (a process group of this process alone) whose comm hook is gradsync.torch.comm_hook, each
rank on its share of every batch, must give the parameters of single-process training on the
full batch within 1e-5 relative (the hook's first two steps go through the socket, the rest
through shared memory), and every rank the same parameters bit for bit. With
$DDPHOOK_COMPRESS (the job's --compress type) the buckets are compressed from the third step:
the ranks must still agree bit for bit and the loss go down. Prints DDPHOOK OK and exits 0, or
exits 1 saying what differs."""

import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gradsync.torch as gs  # noqa: E402
from entry_checks import exit_unless_ranks_agree  # noqa: E402

STEPS, BATCH, TOL = 20, 24, 1e-5


def main():
    gs.init()
    gs.init_ddp_process_group()
    rank, size = gs.rank(), gs.size()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 5 * 5, 16), nn.Tanh(), nn.Linear(16, 10))
    ref = copy.deepcopy(model)
    if rank != 0:  # different starting points everywhere but rank 0: broadcast must fix them
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets after the first step
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    ddp.register_comm_hook(gs.HookState(model), gs.comm_hook)
    compressed = os.environ.get("DDPHOOK_COMPRESS", "")
    if gs.compression() != (compressed or "none"):
        print(f"rank {rank}: compression() is {gs.compression()!r}, want {compressed or 'none'!r}", file=sys.stderr)
        sys.exit(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(STEPS, BATCH, 1, 12, 12, generator=g)
    ys = torch.randint(0, 10, (STEPS, BATCH), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    per = BATCH // size
    if compressed:  # one batch over and over: the loss must fall
        xs, ys = xs[:1].expand(STEPS, -1, -1, -1, -1), ys[:1].expand(STEPS, -1)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss_fn(ddp(xs[s, rank * per:(rank + 1) * per]), ys[s, rank * per:(rank + 1) * per]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(xs[s]), ys[s]).backward()
        ref_opt.step()
        with torch.no_grad():
            losses.append(float(loss_fn(model(xs[s]), ys[s])))
    worst = 0.0
    if compressed:
        if not losses[-1] < 0.7 * losses[0]:
            print(f"rank {rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f}: it did not go down", file=sys.stderr)
            sys.exit(1)
        ref = model  # compressed: no full-batch equivalence to check
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        rel = float((p - q).norm() / q.norm())
        worst = max(worst, rel)
        if rel > TOL:
            print(f"rank {rank}: {name} differs from full-batch training by {rel:.3g} relative", file=sys.stderr)
            sys.exit(1)
    exit_unless_ranks_agree(model, rank)
    print(f"rank {rank}: DDPHOOK OK (worst relative difference {worst:.3g})", flush=True)
    gs.report(final=True, step=STEPS, test_accuracy=0.0)


if __name__ == "__main__":
    main()
