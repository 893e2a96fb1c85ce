#!/usr/bin/env python3
"""Summarise `gradsync bench allreduce --json --algorithm ring,halving_doubling,tree,auto`
sweeps: one markdown row per (transport, ranks, size) with each algorithm's
median time, the fastest measured, the cost model's pick, and whether the
pick was the fastest (exactly, or within 5 %). With two sweep folders it
also says in how many cells the two runs agree on the fastest algorithm,
which bounds how often any model can be "right" at this noise level; and
for each run, how far apart the same algorithm measures when timed twice
(the auto line runs the model's pick, interleaved with the pick's own).

usage: summarize.py RUN_DIR [SECOND_RUN_DIR]
"""
import glob
import json
import os
import sys

ALGOS = ("ring", "halving_doubling", "tree")
SHORT = {"ring": "ring", "halving_doubling": "hd", "tree": "tree"}


def load(d):
    cells = {}
    for f in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
        for line in open(f):
            r = json.loads(line)
            k = (r["transport"], r["ranks"], r["size_bytes"])
            cells.setdefault(k, {})[r["algorithm"]] = r
    return cells


def size(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s} {unit}"
    return f"{b} B"


def summarize(cells):
    print("| transport | ranks | size | ring ms | hd ms | tree ms | auto ms | fastest | model pick | α µs | β µs/KiB | pick fastest? |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    hit = near = 0
    fastest = {}
    noise = []
    for k in sorted(cells):
        c = cells[k]
        t = {a: c[a]["time_ms"] for a in ALGOS}
        f = min(t, key=t.get)
        fastest[k] = f
        pick = c["ring"]["model_pick"]
        ok = pick == f
        close = t[pick] <= 1.05 * t[f]
        hit += ok
        near += close
        # auto ran the pick itself, interleaved with it: their difference
        # is what the same algorithm measures apart at this load.
        noise.append(abs(c["auto"]["time_ms"] / t[pick] - 1))
        verdict = "yes" if ok else ("within 5 %" if close else "no")
        print(f"| {k[0]} | {k[1]} | {size(k[2])} | " + " | ".join(f"{t[a]:.3f}" for a in ALGOS)
              + f" | {c['auto']['time_ms']:.3f} | {SHORT[f]} | {SHORT[pick]} | {c['ring']['model_alpha_us']:.2f} | {c['ring']['model_beta_us_per_kib']:.3f} | {verdict} |")
    n = len(cells)
    print()
    print(f"model pick = fastest measured: {hit}/{n} cells ({100 * hit / n:.0f} %); within 5 % of the fastest: {near}/{n} ({100 * near / n:.0f} %)")
    noise.sort()
    print(f"the same algorithm timed twice (auto vs its pick, interleaved) differs by a median {100 * noise[len(noise) // 2]:.0f} %, "
          f"and by more than 10 % in {sum(x > 0.10 for x in noise)}/{n} cells")
    return fastest


def main():
    runs = sys.argv[1:]
    firsts = []
    for d in runs:
        print(f"\n### {d}\n")
        firsts.append(summarize(load(d)))
    if len(firsts) == 2:
        a, b = firsts
        common = sorted(set(a) & set(b))
        agree = sum(a[k] == b[k] for k in common)
        print(f"\nthe two runs agree on the fastest algorithm in {agree}/{len(common)} cells ({100 * agree / len(common):.0f} %)")


if __name__ == "__main__":
    main()
