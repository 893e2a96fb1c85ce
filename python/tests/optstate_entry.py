"""Run as an entrypoint job's command (see test_gradsync.py): rank 0's Adam (after three steps,
with its own lr) and SGD-with-momentum states reach every rank through
gradsync.torch.broadcast_optimizer_state, bit for bit, also on a rank that never stepped; a
rank whose optimiser has other parameter groups is refused with a clear error. Prints
OPTSTATE OK and exits 0, or exits 1 saying what differs."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gradsync.torch as gs  # noqa: E402


def flat_state(opt):
    """Every tensor and number of opt's state_dict, in a fixed order, as float64 bits."""
    sd = opt.state_dict()
    out = []
    for k in sorted(sd["state"]):
        for name in sorted(sd["state"][k]):
            v = sd["state"][k][name]
            out.append(v.detach().reshape(-1).double() if torch.is_tensor(v) else torch.tensor([float(v)], dtype=torch.float64))
    for g in sd["param_groups"]:
        for name in sorted(g):
            if name != "params" and isinstance(g[name], (int, float)) and not isinstance(g[name], bool):
                out.append(torch.tensor([float(g[name])], dtype=torch.float64))
            elif name == "betas":
                out.append(torch.tensor([float(b) for b in g[name]], dtype=torch.float64))
    return torch.cat(out).numpy() if out else np.zeros(0)


def check(name, opt, rank):
    mine = flat_state(opt)
    # rank 0's values through the agent too, as 16-bit pieces of their bits (exact in float32).
    words = mine.view(np.uint32) if rank == 0 else np.zeros(len(mine) * 2, dtype=np.uint32)
    hi = gs.agent().broadcast(np.right_shift(words, 16).astype(np.float32), root=0)
    lo = gs.agent().broadcast(np.bitwise_and(words, 0xFFFF).astype(np.float32), root=0)
    root = ((hi.astype(np.uint32) << 16) | lo.astype(np.uint32)).view(np.float64)
    if len(mine) == 0 or not np.array_equal(mine.view(np.uint64), root.view(np.uint64)):
        print(f"{name}: rank {rank}'s state differs from rank 0's ({len(mine)} values)", flush=True)
        sys.exit(1)


def main():
    gs.init()
    rank = gs.rank()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3 * (rank + 1), betas=(0.9, 0.99 - 0.01 * rank))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rank == 0:  # only rank 0 has stepped
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            for opt in (adam, sgd):
                opt.zero_grad()
                model(torch.randn(4, 6, generator=g)).pow(2).sum().backward()
                opt.step()
    gs.broadcast_optimizer_state(adam, root_rank=0)
    gs.broadcast_optimizer_state(gs.DistributedOptimizer(sgd, named_parameters=model.named_parameters()), root_rank=0)
    check("adam", adam, rank)
    check("sgd", sgd, rank)
    if adam.param_groups[0]["lr"] != 1e-3:
        print(f"adam lr on rank {rank}: {adam.param_groups[0]['lr']}, want rank 0's 1e-3", flush=True)
        sys.exit(1)
    # Other parameter groups than the root's: refused, saying so.
    other = torch.optim.Adam([{"params": [model[0].weight]}, {"params": [model[0].bias]}] if rank == 1
                             else [{"params": [model[0].weight, model[0].bias]}])
    try:
        gs.broadcast_optimizer_state(other, root_rank=0)
    except ValueError as e:
        if rank != 1 or "other parameter groups" not in str(e):
            raise
        print("refused as expected:", e, flush=True)
    else:
        if rank == 1:
            print("a mismatched optimiser was not refused", flush=True)
            sys.exit(1)
    print("OPTSTATE OK", flush=True)


if __name__ == "__main__":
    main()
