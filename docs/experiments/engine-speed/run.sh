#!/usr/bin/env bash
# Engine training throughput against PyTorch, side by side in one run
# (issue #3's speed point): batch 64, one thread, PyTorch first, then
# gradsync straight after. Run it under /tmp/quiet.sh on the shared machine:
#   /tmp/quiet.sh bash docs/experiments/engine-speed/run.sh | tee /tmp/engine-speed.log
# Env: GS (gradsync binary; built to /tmp/gs-speed if absent), TORCH_TUNED=1
# adds a PyTorch run with OPENBLAS_CORETYPE=SkylakeX (the kernels gradsync
# picks for itself; Debian's PyTorch gets Prescott-class ones on this VM).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
ANCHOR=${ANCHOR:-$ROOT/../shared/anchors/pytorch/train_throughput.py}
GS=${GS:-/tmp/gs-speed}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
echo "# date $(date -u +%FT%TZ) commit $(git -C "$ROOT" rev-parse --short HEAD)"
echo "# cpu $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) vCPU); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# torch: /usr/bin/python3 $ANCHOR --threads 1 --models mlp,lenet,kerascnn --seconds 2 --reps 3"
/usr/bin/python3 "$ANCHOR" --threads 1 --models mlp,lenet,kerascnn --seconds 2 --reps 3
if [ "${TORCH_TUNED:-0}" = 1 ]; then
  echo "# torch tuned: OPENBLAS_CORETYPE=SkylakeX, same command"
  OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 "$ANCHOR" --threads 1 --models mlp,lenet,kerascnn --seconds 2 --reps 3
fi
echo "# gradsync: $GS bench train --model mlp,lenet5,cnn --batch-size 64 --threads 1 --json"
"$GS" bench train --model mlp,lenet5,cnn --batch-size 64 --threads 1 --json
