#!/usr/bin/env bash
# Gradient compression on the Keras `cnn`, 2 workers, ring mode (issue #5).
#   bash docs/experiments/compression/run.sh accuracy   # 3 epochs, MNIST and Fashion-MNIST, loopback
#   bash docs/experiments/compression/run.sh timing     # time per step on loopback, 1 Gbit/s and 100 Mbit/s links
# Env: GS (binary; built to /tmp/gscomp if absent), RUNS_DIR (default /tmp/compruns),
# METHODS (default all), SEED (default 1), STEPS (timing: steps per run, default 80).
# Links are emulated in process by internal/netem (--link-rate): every worker's
# connections (ring peers and coordinator) carry at most that rate each way.
# Appends to accuracy.csv / timing.csv next to this script.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gscomp}
RUNS_DIR=${RUNS_DIR:-/tmp/compruns}
SEED=${SEED:-1}
STEPS=${STEPS:-80}
METHODS=${METHODS:-"none fp16 int8 topk-1% powersgd-r1 powersgd-r2 powersgd-r4"}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
mkdir -p "$RUNS_DIR"

compress_arg() {
  case $1 in
    none) echo "" ;;
    fp16) echo "--compress fp16" ;;
    int8) echo "--compress int8" ;;
    topk-1%) echo "--compress topk:ratio=0.01" ;;
    powersgd-r*) echo "--compress powersgd:rank=${1#powersgd-r}" ;;
  esac
}

COMMON=(local --insecure --json --mode ring --workers 2 --model cnn --seed "$SEED" --runs-dir "$RUNS_DIR")

# summary field, 0 when absent
field() { jq -r ".$2 // 0" <<<"$1"; }

# steady DIR: gradient bytes rank 0 sent per step from step 20 on (after
# PowerSGD's start_iter of 10 plain steps), from the cumulative means in
# its progress records.
steady() {
  jq -rs '[.[] | select(.kind=="progress" and .rank==0 and .step>=20)] as $p
    | if ($p|length) < 2 then 0 else
      (($p[-1].sent_bytes_per_step*$p[-1].step) - ($p[0].sent_bytes_per_step*$p[0].step)) / ($p[-1].step-$p[0].step) end' "$1/metrics.jsonl"
}

case ${1:-} in
accuracy)
  out_csv=$HERE/accuracy.csv
  [ -f "$out_csv" ] || echo "dataset,method,seed,epochs,test_accuracy,raw_bytes_per_step,sent_bytes_per_step,compression_ratio,steady_sent_bytes_per_step,compress_seconds,wall_seconds,steps" >"$out_csv"
  for ds in ${DATASETS:-mnist fashion-mnist}; do
    for m in $METHODS; do
      # shellcheck disable=SC2046
      s=$("$GS" "${COMMON[@]}" --dataset "$ds" --epochs 3 $(compress_arg "$m") 2>/dev/null | tail -1)
      echo "$ds,$m,$SEED,3,$(field "$s" test_accuracy),$(field "$s" raw_bytes_per_step),$(field "$s" sent_bytes_per_step),$(field "$s" compression_ratio),$(steady "$(field "$s" run_dir)"),$(field "$s" compress_seconds),$(field "$s" wall_seconds),$(field "$s" steps)" | tee -a "$out_csv"
    done
  done
  ;;
timing)
  out_csv=$HERE/timing.csv
  [ -f "$out_csv" ] || echo "link,method,steps_timed,seconds_per_step,steady_sent_bytes_per_step,compress_seconds_per_step" >"$out_csv"
  for link in ${LINKS:-loopback 1Gbit 100Mbit}; do
    la=(); [ "$link" = loopback ] || la=(--link-rate "$link")
    for m in $METHODS; do
      # shellcheck disable=SC2046
      s=$("$GS" "${COMMON[@]}" --dataset mnist --epochs 1 --max-steps "$STEPS" --log-every 10 "${la[@]}" $(compress_arg "$m") 2>/dev/null | tail -1)
      dir=$(field "$s" run_dir)
      # Time per step from rank 0's progress records after step 30 (past
      # PowerSGD's start_iter of 10 plain steps, and warm-up).
      read -r n sps < <(jq -rs '[.[] | select(.kind=="progress" and .rank==0 and .step>=30)] as $p
        | if ($p|length) < 2 then "0 0" else "\($p[-1].step-$p[0].step) \(($p[-1].elapsed_seconds-$p[0].elapsed_seconds)/($p[-1].step-$p[0].step))" end' "$dir/metrics.jsonl")
      steps=$(field "$s" steps)
      cps=$(jq -rn --argjson c "$(field "$s" compress_seconds)" --argjson n "$steps" 'if $n > 0 then $c / $n else 0 end')
      echo "$link,$m,$n,$sps,$(steady "$dir"),$cps" | tee -a "$out_csv"
    done
  done
  ;;
*)
  echo "usage: $0 accuracy|timing" >&2
  exit 2
  ;;
esac
