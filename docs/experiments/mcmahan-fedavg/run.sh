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
# (A generous heartbeat timeout: under `nice -n 19` on a busy machine the
# process can be starved for seconds.)
# Env: GS (binary; built to /tmp/gsfl if absent), RUNS_DIR (default /tmp/flruns),
# LR (client learning rate; default 0.1 for fedavg, 0.2 for fedsgd), SEED (default 1).
# STOP_AT (e.g. 0.99) ends the run at the first evaluation that reaches it.
# Prints the run directory; rounds.csv next to this script gets one line per
# evaluated round (method, lr, round, test accuracy, elapsed seconds, CPU seconds).
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
  --partition shards --seed "$SEED" --runs-dir "$RUNS_DIR" --heartbeat-timeout 300s)
method=${1:?fedavg or fedsgd}
case $method in
  fedavg) args=(--local-epochs 5 --local-batch 10 --lr "${LR:-0.1}" --rounds 100000) ;;
  fedsgd) args=(--local-epochs 1 --lr "${LR:-0.2}" --rounds 100000 -f "$HERE/fedsgd.yaml") ;;
  *) echo "usage: $0 fedavg|fedsgd SECONDS" >&2; exit 2 ;;
esac
# Stop at the wall-clock budget, or once an evaluation reaches STOP_AT (a
# fraction, e.g. 0.99); the run directory keeps every evaluation. A sampler
# records the process's CPU seconds (user + system, from /proc) every 2 s, so
# that runs sharing the machine with other work (`nice -n 19`) can still be
# compared by the compute they used.
before=$(ls -td "$RUNS_DIR"/*/ 2>/dev/null | head -1 || true)
timeout --signal=INT "${2:?seconds}" "$GS" "${COMMON[@]}" "${args[@]}" >/dev/null 2>&1 &
tpid=$!
sleep 1
gpid=$(pgrep -P "$tpid" | head -1 || true)
dir=""
cpulog=$(mktemp)
tick=$(getconf CLK_TCK)
while kill -0 "$tpid" 2>/dev/null; do
  if [ -z "$dir" ]; then
    d=$(ls -td "$RUNS_DIR"/*/ 2>/dev/null | head -1 || true)
    [ -n "$d" ] && [ "$d" != "$before" ] && dir=$d
  fi
  if [ -n "$gpid" ] && [ -r "/proc/$gpid/stat" ]; then
    # fields 14 and 15 are utime and stime in clock ticks (comm has no spaces here)
    awk -v t="$(date +%s)" -v hz="$tick" '{print t, ($14+$15)/hz}' "/proc/$gpid/stat" >>"$cpulog" || true
  fi
  if [ -n "${STOP_AT:-}" ] && [ -n "$dir" ] && [ -f "$dir/metrics.jsonl" ] &&
    jq -e --argjson t "$STOP_AT" 'select(.kind=="eval" and .test_accuracy >= $t)' "$dir/metrics.jsonl" >/dev/null 2>&1; then
    kill -INT "$gpid" 2>/dev/null || true
  fi
  sleep 2
done
wait "$tpid" || true
dir=${dir:-$(ls -td "$RUNS_DIR"/*/ | head -1)}
echo "$dir"
[ -f "$HERE/rounds.csv" ] || echo "method,lr,round,test_accuracy,elapsed_seconds,cpu_seconds" >"$HERE/rounds.csv"
start=$(jq -rs '[.[] | select(.kind=="state" and .state=="RUNNING")][0].time' "$dir/metrics.jsonl")
jq -rc --arg m "$method" --arg lr "${LR:-default}" --arg start "$start" \
  'select(.kind=="eval") | [$m, $lr, .round, .test_accuracy, ((.time|sub("\\.[0-9]+Z$";"Z")|fromdate) - ($start|sub("\\.[0-9]+Z$";"Z")|fromdate)), (.time|sub("\\.[0-9]+Z$";"Z")|fromdate)] | @csv' \
  "$dir/metrics.jsonl" |
  # the last column becomes the CPU seconds sampled at or just before that moment
  awk -F, -v OFS=, -v cpulogf="$cpulog" 'BEGIN { while ((getline l < cpulogf) > 0) { split(l, a, " "); n++; ts[n]=a[1]; cs[n]=a[2] } }
    { t=$NF; c=""; for (i=1; i<=n; i++) if (ts[i] <= t) c=cs[i]; $NF=c; print }' >>"$HERE/rounds.csv"
rm -f "$cpulog"
