#!/usr/bin/env bash
# FedAvg-family methods on MNIST under Dirichlet(alpha) label skew, 20 clients.
# Re-run from the repository root:
#   bash docs/experiments/fedavg-dirichlet/run.sh
# Env: GSFED (binary; built to /tmp/gsfed if absent), RUNS_DIR (default
# /tmp/fedruns), SEEDS (default "1 2 3"), ROUNDS (default 50).
# Writes results.csv next to this script, then the plot (go run ./.../plot).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GSFED=${GSFED:-/tmp/gsfed}
RUNS_DIR=${RUNS_DIR:-/tmp/fedruns}
SEEDS=${SEEDS:-"1 2 3"}
ROUNDS=${ROUNDS:-50}
if [ ! -x "$GSFED" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GSFED" ./cmd/gradsync)
fi
mkdir -p "$RUNS_DIR"
MANIFEST=$(mktemp)
trap 'rm -f "$MANIFEST"' EXIT

# Fixed budget: 50 rounds, C = 0.25 (5 of 20 clients per round), E = 1,
# B = 32, client SGD lr 0.05 (default, no momentum). Server-side settings are
# each strategy's defaults: FedProx mu = 0.01; FedAvgM eta = 0.1, beta = 0.9;
# FedAdam eta = 0.01, beta1 = 0.9, beta2 = 0.99, tau = 1e-3; class-balanced
# reweighting beta = 0.999. Nothing was tuned.
COMMON=(local --insecure --json --mode fedavg --model mlp --dataset mnist
  --rounds "$ROUNDS" --clients 20 --fraction 0.25 --local-epochs 1 --local-batch 32
  --partition dirichlet --runs-dir "$RUNS_DIR")

method_args() {
  case $1 in
    fedavg)      echo "--strategy fedavg" ;;
    fedprox)     echo "--strategy fedprox --mu 0.01" ;;
    fedavgm)     echo "--strategy fedavgm" ;;
    fedadam)     echo "--strategy fedadam" ;;
    fedavg-cb)   echo "--strategy fedavg -f $HERE/job-class-balanced.yaml" ;;
  esac
}

start=$(date +%s)
for alpha in 0.1 1 100; do
  for method in fedavg fedprox fedavgm fedadam fedavg-cb; do
    for seed in $SEEDS; do
      t0=$(date +%s)
      # shellcheck disable=SC2046
      summary=$(nice -n 10 "$GSFED" "${COMMON[@]}" --alpha "$alpha" --seed "$seed" \
        $(method_args "$method") 2>/dev/null | tail -n 1)
      run_dir=$(printf '%s' "$summary" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run_dir"])')
      acc=$(printf '%s' "$summary" | python3 -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
      echo "$alpha $method $seed $run_dir" >> "$MANIFEST"
      echo "alpha=$alpha method=$method seed=$seed acc=$acc ($(( $(date +%s) - t0 )) s) $run_dir" >&2
    done
  done
done
echo "grid wall time: $(( $(date +%s) - start )) s" >&2

# results.csv: one row per run, per-round test accuracies r1..rN from metrics.jsonl.
python3 - "$MANIFEST" "$ROUNDS" > "$HERE/results.csv" <<'PY'
import json, sys
manifest, rounds = sys.argv[1], int(sys.argv[2])
print(",".join(["alpha", "method", "seed", "final_test_accuracy"] + [f"r{i}" for i in range(1, rounds + 1)]))
for line in open(manifest):
    alpha, method, seed, run_dir = line.split()
    acc = {}
    for rec in map(json.loads, open(f"{run_dir}/metrics.jsonl")):
        if rec.get("kind") == "eval":
            acc[rec["round"]] = rec["test_accuracy"]
    assert sorted(acc) == list(range(1, rounds + 1)), (run_dir, sorted(acc))
    print(",".join([alpha, method, seed, f"{acc[rounds]:.4f}"] + [f"{acc[r]:.4f}" for r in range(1, rounds + 1)]))
PY

cd "$ROOT" && go run ./docs/experiments/fedavg-dirichlet/plot
