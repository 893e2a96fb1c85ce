#!/usr/bin/env bash
# shm-vs-grpc-gloo.sh BIN [ROUNDS] [RANKS] [SIZES] — interleaved all-reduce
# timings of gradsync's gRPC ring, its shared-memory ring and gloo (Debian's
# python3-torch, through allreduce_gloo_bytes.py beside this script, timed as
# ../shared/anchors/pytorch/allreduce_gloo.py times it), one line of JSON per
# size and run on stdout, each with its round. Per round: every transport in
# $TRANSPORTS (default "grpc shm"; "auto" works too and names what it chose),
# then gloo. summarize.py turns the lines into the table of medians.
set -euo pipefail
bin=${1:?usage: shm-vs-grpc-gloo.sh GRADSYNC-BINARY [ROUNDS] [RANKS] [SIZES]}
rounds=${2:-3}; ranks=${3:-2}; sizes=${4:-4K,16K,64K,256K,4M,16M,64M}
reps=${REPS:-15}
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq "$rounds"); do
  for t in ${TRANSPORTS:-grpc shm}; do
    "$bin" bench allreduce --ranks "$ranks" --sizes "$sizes" --reps "$reps" --transport "$t" --json |
      sed "s/^{/{\"round\":$r,\"asked\":\"$t\",\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",/"
  done
  /usr/bin/python3 "$here/allreduce_gloo_bytes.py" --world "$ranks" --sizes "$sizes" --reps "$reps" 2>/dev/null |
    sed "s/^{/{\"round\":$r,\"asked\":\"gloo\",\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",/"
done
