#!/usr/bin/env bash
# parity.sh BIN — runs a fixed set of seeded jobs with the gradsync binary BIN
# and prints one line per job: name, state, test accuracy, parameter
# checksum. Two builds that compute the same thing print the same table;
# a refactor is checked by diffing the tables of the builds before and
# after it (same machine, same data).
#   bash scripts/parity.sh /tmp/gs-before > before.txt
#   bash scripts/parity.sh bin/gradsync   > after.txt && diff before.txt after.txt
set -uo pipefail
bin=${1:?usage: parity.sh GRADSYNC-BINARY}
runs=$(mktemp -d); trap 'rm -rf "$runs"' EXIT
run() {
  local name=$1; shift
  local out
  out=$("$bin" local --insecure --json --runs-dir "$runs" --seed 1 "$@" 2>/dev/null | tail -1)
  python3 -c 'import json,sys
s=json.loads(sys.argv[2] or "{}")
print("%-22s %-10s %-8s %s" % (sys.argv[1], s.get("state","?"), "%.4f" % s.get("test_accuracy",0), s.get("parameter_checksum","-")))' "$name" "$out"
}
run make-local       --workers 2 --model mlp --dataset mnist --epochs 1
run ps-1shard        --workers 2 --model mlp --mode ps --ps-shards 1 --max-steps 300
run ps-2shards       --workers 2 --model mlp --mode ps --ps-shards 2 --max-steps 300
run ps-powersgd      --workers 2 --model mlp --mode ps --compress powersgd:rank=2,start_iter=10 --max-steps 300
run ring             --workers 2 --model lenet5 --mode ring --max-steps 200
run ring-powersgd    --workers 2 --model mlp --mode ring --compress powersgd:rank=2,start_iter=10 --max-steps 300
run ring-topk        --workers 2 --model mlp --mode ring --compress topk:ratio=0.01 --max-steps 300
run fedavg-sim       --workers 1 --model mlp --mode fedavg --rounds 3 --clients 10 --fraction 0.3 --partition dirichlet
run fedavg-real      --workers 3 --model mlp --mode fedavg --rounds 3 --fraction 1 --partition iid
