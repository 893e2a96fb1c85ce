#!/usr/bin/env bash
# Interleaved training throughput, gradsync then PyTorch (tuned setup:
# ../shared/anchors/README.md), one thread, batch 64, 3×32×32, 10 classes.
# Both report wall-clock images/s and the process CPU seconds per step.
# Usage: pairs.sh GRADSYNC_BINARY ROUNDS MODEL... (from the repository root)
set -euo pipefail
bin=$1 rounds=$2
shift 2
export OMP_NUM_THREADS=1
torch_env=(env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp
	GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296)
for r in $(seq "$rounds"); do
	for m in "$@"; do
		echo "round $r $m load $(cut -d' ' -f1-3 /proc/loadavg)"
		"$bin" bench train --model "$m" --input 3x32x32 --classes 10 --seconds 5 --json
		"${torch_env[@]}" /usr/bin/python3 docs/experiments/engine/torch_train_cpu.py "$m" 10 5
	done
done
