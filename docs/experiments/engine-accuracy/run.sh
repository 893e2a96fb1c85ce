#!/usr/bin/env bash
# Accuracy targets of the engine issue (#3), `gradsync local --workers 1`.
# Re-run from anywhere:  bash docs/experiments/engine-accuracy/run.sh [NAME...]
# Env: GS (binary; built to /tmp/gsacc if absent), RUNS_DIR (default /tmp/accruns).
# Appends one CSV line per run to results.csv next to this script.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GS=${GS:-/tmp/gsacc}
RUNS_DIR=${RUNS_DIR:-/tmp/accruns}
if [ ! -x "$GS" ]; then
  (cd "$ROOT" && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -o "$GS" ./cmd/gradsync)
fi
mkdir -p "$RUNS_DIR"
[ -f "$HERE/results.csv" ] || echo "run,model,dataset,epochs,seed,test_accuracy,wall_seconds,args" > "$HERE/results.csv"

# name: model dataset epochs extra-args
runs() {
  case $1 in
    lenet5-b64)   echo "lenet5 mnist 2 --batch-size 64 --lr 0.1" ;;
    lenet5-default) echo "lenet5 mnist 2" ;;
    lenet5-adam)  echo "lenet5 mnist 2 --batch-size 64 -f $HERE/adam.yaml" ;;
    lenet5-adam-b32) echo "lenet5 mnist 2 -f $HERE/adam.yaml" ;;
    cnn-adam)     echo "cnn mnist 3 --batch-size 64 -f $HERE/adam.yaml" ;;
    cnn-crop)     echo "cnn mnist 3 --batch-size 64 -f $HERE/crop-adam.yaml" ;;
    cnn-fashion)  echo "cnn fashion-mnist 5 -f $HERE/fashion-adam.yaml" ;;
    resnet8-fashion) echo "resnet8 fashion-mnist 5 --batch-size 64 --lr 0.1 -f $HERE/augment-flip.yaml" ;;
    vit-adamw)    echo "vit-tiny mnist 10 --batch-size 64 -f $HERE/adamw.yaml" ;;
  esac
}
NAMES=${*:-"lenet5-b64 cnn-adam resnet8-fashion vit-adamw"}
for name in $NAMES; do
  for seed in ${SEEDS:-1}; do
    read -r model ds epochs extra <<<"$(runs "$name")"
    # shellcheck disable=SC2086
    out=$("$GS" local --json --workers 1 --model "$model" --dataset "$ds" --epochs "$epochs" --seed "$seed" \
      --runs-dir "$RUNS_DIR" $extra 2>/dev/null | tail -1)
    acc=$(jq -r .test_accuracy <<<"$out"); wall=$(jq -r .wall_seconds <<<"$out")
    echo "$name,$model,$ds,$epochs,$seed,$acc,$wall,\"$extra\"" | tee -a "$HERE/results.csv"
  done
done
