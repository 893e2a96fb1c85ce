#!/usr/bin/env bash
# Ring all-reduce over gRPC against gloo, side by side in one run (issue #4):
# gloo 2 ranks, gradsync 2 ranks, gloo 4, gradsync 4; 4, 16 and 64 MiB;
# 15 timed reps each, median of the slowest rank per rep (both tools).
#   bash docs/experiments/allreduce/run.sh [OUT_DIR]
# Env: GS (gradsync binary; built from this checkout to /tmp/gs-arb if
# absent), SIZES_MIB (default 4,16,64), REPS (default 15), RANKS (default
# "2 4"), QUIET (the wrapper that serialises heavy runs; default /tmp/quiet.sh
# when it exists). Writes gloo-N.txt, gradsync-N.jsonl and ratios.md to
# OUT_DIR (default /tmp/arb-<time>) and prints the table.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gs-arb}
SIZES_MIB=${SIZES_MIB:-4,16,64}
REPS=${REPS:-15}
RANKS=${RANKS:-"2 4"}
OUT=${1:-/tmp/arb-$(date +%Y%m%d-%H%M%S)}
QUIET=${QUIET-}
if [ -z "$QUIET" ] && [ -x /tmp/quiet.sh ]; then QUIET=/tmp/quiet.sh; fi
GLOO=/work/shared/anchors/pytorch/allreduce_gloo.py
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
mkdir -p "$OUT"
gs_sizes=$(sed 's/\([0-9]\+\)/\1M/g' <<<"$SIZES_MIB")
{
  echo "date: $(date -Is)"
  echo "host: $(uname -n) $(uname -r); $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "gradsync: $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet -- aggregator cmd || echo '+dirty') ($GS)"
  echo "torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/env.txt"
for n in $RANKS; do
  $QUIET /usr/bin/python3 "$GLOO" --world "$n" --sizes-mib "$SIZES_MIB" --reps "$REPS" --quiet-wait 0 | tee "$OUT/gloo-$n.txt"
  $QUIET "$GS" bench allreduce --ranks "$n" --sizes "$gs_sizes" --reps "$REPS" --json | tee "$OUT/gradsync-$n.jsonl"
done
# Table: ranks, size, gloo busbw, gradsync busbw, ratio.
{
  echo "| ranks | size | gloo busbw GB/s | gradsync busbw GB/s | ratio |"
  echo "|---|---|---|---|---|"
  for n in $RANKS; do
    for mib in ${SIZES_MIB//,/ }; do
      g=$(grep -E "size= *$mib""MiB" "$OUT/gloo-$n.txt" | sed -E 's/.*busbw +([0-9.]+) GB\/s.*/\1/')
      s=$(jq -r "select(.size_bytes == $((mib << 20))) | .busbw_gbs" "$OUT/gradsync-$n.jsonl")
      printf '| %d | %d MiB | %.3f | %.3f | %.2f |\n' "$n" "$mib" "$g" "$s" "$(echo "$s / $g" | bc -l)"
    done
  done
} | tee "$OUT/ratios.md"
