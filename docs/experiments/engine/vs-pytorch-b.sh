#!/usr/bin/env bash
# Interleaved training throughput and CPU time per step, batch 64: two
# gradsync builds (before and after a change) and PyTorch in the tuned
# setup (openmp OpenBLAS, glibc malloc tunables), one after the other for
# each model, ROUNDS times; then cnn and resnet8 at two threads.
# Usage (from the repository root): vs-pytorch-b.sh GS_NEW GS_BASE ROUNDS
set -uo pipefail
new=$1 base=$2 rounds=${3:-3}
torch_env=(env OMP_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp
	GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296)
gs() { # binary model input threads seconds
	"$1" bench train --model "$2" --input "$3" --classes 10 --threads "$4" --seconds "$5" --json 2>/dev/null | tail -1 |
		python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%.1f img/s %.4f CPU s/step" % (d["images_per_second"], d["cpu_seconds_per_step"]))'
}
torch() { # model input threads seconds
	"${torch_env[@]}" THREADS="$3" OMP_NUM_THREADS="$3" /usr/bin/python3 docs/experiments/engine/torch_train_cpu.py "$1" 10 "$4" "$2" 2>/dev/null |
		tail -1 | sed -E 's/.*: [0-9]+ steps, //; s/ images\/s/ img\/s/'
}
echo "# $(date -u) $(lscpu | grep 'Model name' | tr -s ' ') load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
	for mi in resnet8:1x28x28:4 resnet8:3x32x32:4 cnn:1x28x28:4 mobilenet:3x32x32:5 resnet18:3x32x32:8; do
		IFS=: read -r m in s <<<"$mi"
		echo "round $r $m $in t1 new     $(gs "$new" "$m" "$in" 1 "$s") load $(cut -d' ' -f1 /proc/loadavg)"
		echo "round $r $m $in t1 base    $(gs "$base" "$m" "$in" 1 "$s") load $(cut -d' ' -f1 /proc/loadavg)"
		echo "round $r $m $in t1 pytorch $(torch "$m" "$in" 1 "$s") load $(cut -d' ' -f1 /proc/loadavg)"
	done
	for m in cnn resnet8; do
		echo "round $r $m 1x28x28 t2 new     $(gs "$new" "$m" 1x28x28 2 4) load $(cut -d' ' -f1 /proc/loadavg)"
		echo "round $r $m 1x28x28 t2 pytorch $(torch "$m" 1x28x28 2 4) load $(cut -d' ' -f1 /proc/loadavg)"
	done
done
