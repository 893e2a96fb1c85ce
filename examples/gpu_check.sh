#!/usr/bin/env bash
# gpu_check.sh — the short device check of the PyTorch path, for a machine
# with a CUDA GPU and Debian's (or any CUDA-enabled) torch: 2 local workers
# run examples/torch_mnist.py on the GPU (--device cuda: gradients are
# copied to host memory bucket by bucket, then reduced by the workers) for
# 200 steps, and print the job's summary. Exits non-zero if torch sees no
# GPU or the job does not succeed.
#   bash examples/gpu_check.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-/usr/bin/python3}
"$py" -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", ok, torch.cuda.get_device_name(0) if ok else ""); sys.exit(0 if ok else 1)'
go build -o /tmp/gradsync-gpu ./cmd/gradsync
runs=$(mktemp -d)
/tmp/gradsync-gpu local --workers 2 --runs-dir "$runs" --step-timeout 300 \
  --entrypoint "$py examples/torch_mnist.py --epochs 1 --max-steps 200 --device cuda"
cat "$runs"/*/rank-0.log
