"""Checks the entrypoint scripts next to this file share."""

import sys

import torch

import gradsync.torch as gs


def exit_unless_ranks_agree(model, rank):
    """Exits 1 unless model's parameters equal rank 0's bit for bit (rank 0's are broadcast and
    compared with this rank's own)."""
    mine = [p.detach().clone() for p in model.parameters()]
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    for (name, p), q in zip(model.named_parameters(), mine):
        if not torch.equal(p, q):
            print(f"rank {rank}: {name} differs from rank 0's", file=sys.stderr)
            sys.exit(1)
