"""Run as an entrypoint job's command (see test_gradsync.py): two all-reduces on every rank,
then rank 1 hangs (sleeps, making no more calls) while the others make a third. Their agents
fail that call at the step timeout naming rank 1 as the rank that never joined, and they exit
with that error on stderr."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from gradsync.client import Agent  # noqa: E402


def main():
    a = Agent()
    for _ in range(2):
        a.allreduce(np.ones(1000, dtype=np.float32))
    if a.rank == 1:
        print("rank 1: hanging on purpose", file=sys.stderr, flush=True)
        time.sleep(600)
    a.allreduce(np.ones(1000, dtype=np.float32))  # fails: rank 1 never joins
    print(f"rank {a.rank}: the third all-reduce completed, which it must not", flush=True)


if __name__ == "__main__":
    main()
