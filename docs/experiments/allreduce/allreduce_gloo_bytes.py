"""gloo all_reduce timed like ../shared/anchors/pytorch/allreduce_gloo.py, with
sizes in bytes (K and M suffixes, powers of 1024) so that small messages
(4K-256K) can be measured, and without the anchor's wait for a quiet
machine (this one is never quiet: say the load next to the figures).

Each rep: barrier -> t0 -> all_reduce(SUM) -> t1; per rep the slowest
rank's time is kept; the median over reps is reported.
algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests).

usage: /usr/bin/python3 allreduce_gloo_bytes.py --world 2 --sizes 4K,64K,4M --reps 15
One line of JSON per size, in the columns of `gradsync bench allreduce --json`.
"""
import argparse
import json
import os
import statistics
import sys


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def worker(rank, args):
    import time
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world,
                            init_method=f"tcp://127.0.0.1:{args.port}")
    n = args.world
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)
        assert abs(t[0].item() - n) < 1e-6 and abs(t[-1].item() - n) < 1e-6
        for _ in range(args.warmup):
            dist.all_reduce(t)
        times = []
        for _ in range(args.reps):
            t.fill_(1.0)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        all_times = [None] * n
        dist.all_gather_object(all_times, times)  # not timed
        if rank == 0:
            per_rep = [max(all_times[r][i] for r in range(n)) for i in range(args.reps)]
            med = statistics.median(per_rep)
            algbw = nbytes / med / 1e9
            print(json.dumps({"transport": "gloo", "ranks": n, "size_bytes": nbytes, "elements": nbytes // 4,
                              "reps": args.reps, "time_ms": med * 1e3, "min_ms": min(per_rep) * 1e3,
                              "max_ms": max(per_rep) * 1e3, "algbw_gbs": algbw,
                              "busbw_gbs": algbw * 2 * (n - 1) / n}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="4K,16K,64K,256K,4M,16M,64M")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29541)
    args = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[v] = "1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args,), nprocs=args.world, join=True)
    sys.exit(0)
