#!/bin/bash
# Interleaved speed: gradsync bench train vs PyTorch (tuned setup), batch 64.
# usage: speed.sh GS ROUNDS
GS=${1:?}; R=${2:-3}
M=$(cd "$(dirname "$0")/../../.." && pwd)
TUNED="LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"
echo "# $(date -u) $(lscpu | grep 'Model name' | tr -s ' ') load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 $R); do
  for m in mobilenet resnet18; do
    g=$($GS bench train --model $m --input 3x32x32 --classes 10 --seconds 5 --json 2>/dev/null | tail -1 | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['images_per_second'])")
    p=$(env $TUNED OMP_NUM_THREADS=1 /usr/bin/python3 $M/docs/experiments/data/torch_train_bench.py $m 10 5 2>/dev/null | tail -1 | grep -oE '[0-9.]+ images/s' | cut -d' ' -f1)
    echo "round $r $m gradsync $g pytorch $p load $(cut -d' ' -f1 /proc/loadavg)"
  done
  for t in 1 2; do
    g=$($GS bench train --model cnn,resnet8,lenet5,mlp --threads $t --seconds 3 --json 2>/dev/null | python3 -c "
import json,sys
print(' '.join('%s=%.0f' % (d['model'], d['images_per_second']) for d in map(json.loads, sys.stdin) if 'images_per_second' in d))")
    echo "round $r threads $t gradsync $g load $(cut -d' ' -f1 /proc/loadavg)"
    p8=$(env $TUNED THREADS=$t OMP_NUM_THREADS=$t /usr/bin/python3 $M/docs/experiments/data/torch_train_bench.py resnet8 10 3 1x28x28 2>/dev/null | tail -1 | grep -oE '[0-9.]+ images/s' | cut -d' ' -f1)
    echo "round $r threads $t pytorch resnet8=$p8"
    env $TUNED /usr/bin/python3 $M/../shared/anchors/pytorch/train_throughput.py --threads $t --models mlp,lenet,kerascnn --seconds 3 --reps 1 --quiet-wait 0 2>&1 | grep -E 'img/s median' | sed "s/^/round $r threads $t pytorch /"
  done
done
