"""Times an entrypoint job's all-reduce through its worker's agent, as a PyTorch script's
DistributedOptimizer does it: float32 tensors in the shared-memory region the agent maps,
averaged in place over the job's ring. Run it as the job's command:

  gradsync local --workers 2 --transport shm \\
      --entrypoint '/usr/bin/python3 scripts/agent_allreduce.py --sizes-mib 4,16 --reps 15'

For each size: one checked all-reduce, warm-up, then --reps timed ones, each after a barrier;
rank 0 prints the median time, algbw and busbw (nccl-tests' convention, as
../shared/anchors/pytorch/allreduce_gloo.py reports gloo's) on lines starting with
"agent_allreduce:"."""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402

from gradsync.client import Agent  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="4,16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    a = Agent()
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    numels = [int(m * (1 << 20)) // 4 for m in sizes]
    _, region = a.register_layout([(f"t{i}", (n,)) for i, n in enumerate(numels)], shared_memory=True)
    n = a.size
    off = 0
    for mib, numel in zip(sizes, numels):
        buf = region[off:off + numel]
        buf[:] = a.rank + 1
        a.allreduce_shared_async(off, numel, average=False).result()
        want = n * (n + 1) / 2
        if buf[0] != want or buf[-1] != want:
            sys.exit(f"agent_allreduce: wrong sum {buf[0]}..{buf[-1]}, want {want}")
        for _ in range(args.warmup):
            a.allreduce_shared_async(off, numel).result()
        times = []
        for _ in range(args.reps):
            a.barrier()
            t0 = time.perf_counter()
            a.allreduce_shared_async(off, numel).result()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        algbw = 4 * numel / t / 1e9
        if a.rank == 0:
            print(f"agent_allreduce: world={n} size_mib={mib:g} median_ms={1e3 * t:.2f} "
                  f"algbw_GBps={algbw:.3f} busbw_GBps={algbw * 2 * (n - 1) / n:.3f}", flush=True)
        off += numel


if __name__ == "__main__":
    main()
