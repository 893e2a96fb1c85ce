#!/usr/bin/env bash
# Issue #4's accuracy point: `gradsync local --workers 2 --mode ring --model cnn
# --epochs 2` on MNIST, with the recipe in recipe.yaml (batch 32 per worker,
# global batch 64). Re-run from anywhere:
#   bash docs/experiments/ring-cnn/run.sh            # seeds 1 2 3
#   SEEDS="1" bash docs/experiments/ring-cnn/run.sh
# Env: GS (binary; built to /tmp/gsring if absent), RUNS_DIR (default /tmp/ringruns).
# Appends one CSV line per run to results.csv next to this script.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gsring}
RUNS_DIR=${RUNS_DIR:-/tmp/ringruns}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
mkdir -p "$RUNS_DIR"
[ -f "$HERE/results.csv" ] || echo "recipe,seed,test_accuracy,wall_seconds" >"$HERE/results.csv"
for seed in ${SEEDS:-1 2 3}; do
  out=$("$GS" local --insecure --json --mode ring --workers 2 --model cnn --dataset mnist --epochs 2 \
    --seed "$seed" --runs-dir "$RUNS_DIR" -f "$HERE/recipe.yaml" 2>/dev/null | tail -1)
  echo "recipe.yaml,$seed,$(jq -r .test_accuracy <<<"$out"),$(jq -r .wall_seconds <<<"$out")" | tee -a "$HERE/results.csv"
done
