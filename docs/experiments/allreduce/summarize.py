"""summarize.py < lines — the table of medians over rounds of the JSON lines
that shm-vs-grpc-gloo.sh prints: per (ranks, size), each transport's median
time (ms) and busbw (GB/s), and shm's ratios to gRPC and gloo (busbw ratios;
for times, the inverse)."""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)  # (ranks, size, transport) -> [(time_ms, busbw)]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    runs[(d["ranks"], d["size_bytes"], d["transport"])].append((d["time_ms"], d["busbw_gbs"]))


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


print("| ranks | size | gRPC ms | shm ms | gloo ms | gRPC GB/s | shm GB/s | gloo GB/s | shm/gRPC | shm/gloo | rounds |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for ranks, size in sorted({(k[0], k[1]) for k in runs}):
    med = {}
    for t in ("grpc", "shm", "gloo"):
        xs = runs.get((ranks, size, t), [])
        med[t] = (statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs), len(xs)) if xs else None
    def cell(t, i, fmt):
        return fmt % med[t][i] if med[t] else "–"
    def ratio(a, b):
        return "%.2f×" % (med[a][1] / med[b][1]) if med[a] and med[b] else "–"
    n = "/".join(str(med[t][2]) if med[t] else "0" for t in ("grpc", "shm", "gloo"))
    print(f"| {ranks} | {size_name(size)} | {cell('grpc', 0, '%.3f')} | {cell('shm', 0, '%.3f')} | {cell('gloo', 0, '%.3f')} | "
          f"{cell('grpc', 1, '%.2f')} | {cell('shm', 1, '%.2f')} | {cell('gloo', 1, '%.2f')} | {ratio('shm', 'grpc')} | {ratio('shm', 'gloo')} | {n} |")
