#!/usr/bin/env bash
# Data-parallel scaling side by side (issue #4): training images/s with 2
# workers against 1, one thread each, batch 64 per worker, MNIST —
# gradsync ring mode (`gradsync local --mode ring --workers 1|2`) against
# PyTorch in one process (train_throughput.py --threads 1) and DDP over gloo
# with 2 processes (ddp_throughput.py --world 2), Debian's PyTorch set-up.
#   bash docs/experiments/scaling/run.sh > docs/experiments/scaling/out.log
# Env: GS (binary; built to /tmp/gsscale if absent), ANCHORS (default
# ../shared/anchors/pytorch next to the repository).
# gradsync's figure is the job summary's images_per_second: the training
# loop only, after data loading; the cnn runs take 300 steps per worker so
# that warm-up weighs little.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gsscale}
ANCHORS=${ANCHORS:-$ROOT/../shared/anchors/pytorch}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
g() {
  "$GS" local --insecure --json --mode ring --dataset mnist --batch-size 64 --log-every 100000 --runs-dir /tmp/gsscale-runs "$@" 2>/dev/null |
    tail -1 | jq -r --arg a "$*" '"gradsync \($a): \(.state) \(.images_per_second|floor) img/s"'
}
date -u +"%Y-%m-%dT%H:%MZ"; grep -m1 "model name" /proc/cpuinfo; nproc
for m in lenet5:lenet:1000 cnn:kerascnn:300; do
  IFS=: read -r gm tm steps <<<"$m"
  echo "=== $gm"
  g --model "$gm" --workers 1 --max-steps "$steps"
  g --model "$gm" --workers 2 --max-steps "$steps"
  (cd "$ANCHORS" && /usr/bin/python3 train_throughput.py --threads 1 --models "$tm" --seconds 5 --reps 3 --quiet-wait 0 2>&1 | grep "img/s median" | tail -1)
  (cd "$ANCHORS" && /usr/bin/python3 ddp_throughput.py --world 2 --model "$tm" --seconds 5 --reps 3 --quiet-wait 0 2>&1 | grep "img/s median" | tail -1)
done
