#!/usr/bin/env bash
# McMahan et al. 2017 on MNIST, pathological Non-IID: 100 clients with 2
# shards of 300 examples each (sorted by label), C = 0.1, the paper's CNN
# (fedcnn: 5×5 conv 32, pool, 5×5 conv 64, pool, fc 512; 1,663,370 parameters).
#   bash docs/experiments/mcmahan-fedavg/run.sh fedavg SECONDS  # E = 5, B = 10
#   bash docs/experiments/mcmahan-fedavg/run.sh fedsgd SECONDS  # E = 1, B = ∞ (FedSGD)
# Each runs rounds until the wall-clock budget SECONDS is spent (then the
# job is interrupted; every evaluation so far is in its run directory).
# FedAvg evaluates the global model after every round, FedSGD after every
# 5th (its rounds are short; evaluation would otherwise take half its time).
# Env: GS (binary; built to /tmp/gsfl if absent), RUNS_DIR (default /tmp/flruns),
# LR (client learning rate; default 0.1 for fedavg, 0.2 for fedsgd), SEED (default 1).
# Prints the run directory; rounds.csv next to this script gets one line per
# evaluated round (method, round, test accuracy, elapsed seconds).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gsfl}
RUNS_DIR=${RUNS_DIR:-/tmp/flruns}
SEED=${SEED:-1}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
mkdir -p "$RUNS_DIR"
COMMON=(local --insecure --json --mode fedavg --model fedcnn --dataset mnist --clients 100 --fraction 0.1
  --partition shards --seed "$SEED" --runs-dir "$RUNS_DIR")
method=${1:?fedavg or fedsgd}
case $method in
  fedavg) args=(--local-epochs 5 --local-batch 10 --lr "${LR:-0.1}" --rounds 100000) ;;
  fedsgd) args=(--local-epochs 1 --lr "${LR:-0.2}" --rounds 100000 -f "$HERE/fedsgd.yaml") ;;
  *) echo "usage: $0 fedavg|fedsgd SECONDS" >&2; exit 2 ;;
esac
# Stop at the wall-clock budget; the run directory keeps every evaluation.
timeout --signal=INT "${2:?seconds}" "$GS" "${COMMON[@]}" "${args[@]}" >/dev/null 2>&1 || true
dir=$(ls -td "$RUNS_DIR"/*/ | head -1)
echo "$dir"
[ -f "$HERE/rounds.csv" ] || echo "method,lr,round,test_accuracy,elapsed_seconds" >"$HERE/rounds.csv"
start=$(jq -rs '[.[] | select(.kind=="state" and .state=="RUNNING")][0].time' "$dir/metrics.jsonl")
jq -rc --arg m "$method" --arg lr "${LR:-default}" --arg start "$start" \
  'select(.kind=="eval") | [$m, $lr, .round, .test_accuracy, ((.time|sub("\\.[0-9]+Z$";"Z")|fromdate) - ($start|sub("\\.[0-9]+Z$";"Z")|fromdate))] | @csv' \
  "$dir/metrics.jsonl" >>"$HERE/rounds.csv"
