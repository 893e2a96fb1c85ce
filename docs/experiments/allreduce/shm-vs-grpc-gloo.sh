#!/usr/bin/env bash
# shm-vs-grpc-gloo.sh BIN ROUNDS — interleaved bus bandwidth of gradsync's
# gRPC ring, its shared-memory ring (--transport shm) and gloo
# (../shared/anchors/pytorch/allreduce_gloo.py, Debian's python3-torch), 2 ranks,
# 4/16/64 MiB, one line of JSON per run on stdout (gloo's lines as it prints them).
set -euo pipefail
bin=${1:?usage: shm-vs-grpc-gloo.sh GRADSYNC-BINARY [ROUNDS]}; rounds=${2:-3}
gloo=${GLOO:-/work/shared/anchors/pytorch/allreduce_gloo.py}
for r in $(seq "$rounds"); do
  for t in grpc shm; do
    "$bin" bench allreduce --ranks 2 --sizes 4M,16M,64M --reps 9 --transport "$t" --json | sed "s/^{/{\"round\":$r,/"
  done
  /usr/bin/python3 "$gloo" --world 2 --sizes-mib 4,16,64 --reps 9 2>/dev/null | sed "s/^/gloo round $r: /"
done
