#!/usr/bin/env bash
# ddp_vs_gradsync.sh — examples/torch_mnist.py side by side: under torch.distributed
# DDP with gloo (one process per rank, as torch.distributed.run starts them) and
# under `gradsync local
# --entrypoint`, with the same model and data code, seed, global batch, steps and
# threads per process, interleaved (DDP, gradsync, DDP, gradsync, …). Prints each
# run's test accuracy and images/s (every rank's training images per second of
# training time, rank 0's figure), the medians, and gradsync/DDP.
#
#   bash scripts/ddp_vs_gradsync.sh                               # 2 epochs, 3 rounds
#   bash scripts/ddp_vs_gradsync.sh --epochs 1 --max-steps 50 --rounds 1
#   bash scripts/ddp_vs_gradsync.sh --powersgd-rank 2             # both with PowerSGD
#   bash scripts/ddp_vs_gradsync.sh --transport grpc              # gradsync's ring on gRPC
#
# --transport T: the gradsync ring's data plane (collective.transport; default
# auto: shared memory between the workers of this host, as here).
# --powersgd-rank R [--powersgd-start N]: gradsync gets --compress
# powersgd:rank=R,start_iter=N; DDP gets PyTorch's powerSGD_hook with
# matrix_approximation_rank R and start_powerSGD_iter N (default 10 for both).
# Under Debian's torch 1.13 with gloo that hook aborts at start_powerSGD_iter
# ("gloo::EnforceNotMet ... op.preamble.length <= op.nbytes", seen here with
# the example's CNN, with DDP's default buckets and with one bucket alike):
# the script then says so, goes on with gradsync alone, and prints no ratio.
#
# Environment: GRADSYNC_BIN (else built with go build), PYTHON (default
# /usr/bin/python3, Debian's, which has torch). Speed figures are only worth
# comparing on a quiet machine: the script prints the load before each run.
set -euo pipefail

workers=2 epochs=2 max_steps=0 batch=128 threads=1 rounds=3 seed=1 psgd_rank=0 psgd_start=10 transport=auto
while [ $# -gt 0 ]; do
  case $1 in
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --max-steps) max_steps=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --powersgd-rank) psgd_rank=$2; shift 2 ;;
    --powersgd-start) psgd_start=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "ddp_vs_gradsync: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bin=${GRADSYNC_BIN:-}
if [ -z "$bin" ]; then
  bin=$tmp/gradsync
  (cd "$root" && go build -o "$bin" ./cmd/gradsync)
fi
"$py" -c 'import torch.distributed as d; assert d.is_gloo_available()' ||
  { echo "ddp_vs_gradsync: $py has no torch with gloo (Debian: apt-get install python3-torch)" >&2; exit 1; }

script=$root/examples/torch_mnist.py
common=(--epochs "$epochs" --max-steps "$max_steps" --batch-size "$batch" --threads "$threads" --seed "$seed" --device cpu)
ddp_extra=() gs_extra=()
if [ "$psgd_rank" -gt 0 ]; then
  ddp_extra=(--ddp-powersgd-rank "$psgd_rank" --ddp-powersgd-start "$psgd_start")
  gs_extra=(--compress "powersgd:rank=$psgd_rank,start_iter=$psgd_start")
fi
# Each process gets the same threads (the script sets torch's threads too).
export OMP_NUM_THREADS=$threads

# result LOGFILE: the "torch_mnist result:" line's accuracy, images/s and rank 0's
# training CPU seconds (its process's, threads included; the Go worker's are not in a
# gradsync run's), or "FAILED".
result() {
  local line
  line=$(grep -h '^torch_mnist result:' "$@" 2>/dev/null | tail -1 || true)
  if [ -z "$line" ]; then echo "FAILED"; return; fi
  echo "$line" | tr ' ' '\n' | awk -F= '$1=="test_accuracy"{a=$2} $1=="images_per_second"{i=$2} $1=="train_cpu_seconds"{c=$2} END{print a, i, c}'
}

# run_ddp starts the processes as torch.distributed.run would on one node
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT). Not
# through torch.distributed.run itself: Debian's torch 1.13 under Python
# 3.11 fails in it with "'NoneType' object has no attribute 'get'" (its Std
# flag parsing iterates an IntFlag, which no longer yields the 0 member)
# unless given --redirects 1 --tee 1, which prefixes every line.
run_ddp() {
  local log=$tmp/ddp-$1 port pids=() r ok=0
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in $(seq 0 $((workers - 1))); do
    (cd "$root" && RANK=$r LOCAL_RANK=$r WORLD_SIZE=$workers LOCAL_WORLD_SIZE=$workers \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      exec "$py" "$script" --ddp "${common[@]}" "${ddp_extra[@]}") >"$log-rank-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || ok=1; done
  if [ $ok -ne 0 ]; then echo FAILED; return; fi
  result "$log-rank-0.log"
}

run_gradsync() {
  local runs=$tmp/runs-$1
  (cd "$root" && "$bin" local --workers "$workers" --runs-dir "$runs" \
    --transport "$transport" --entrypoint "$py $script ${common[*]}" "${gs_extra[@]}") >"$tmp/gs-$1.log" 2>&1 || true
  result "$runs"/*/rank-0.log
}

echo "ddp_vs_gradsync: $workers processes, global batch $batch, epochs $epochs, max steps $max_steps, threads $threads, seed $seed, gradsync transport $transport$( [ "$psgd_rank" -gt 0 ] && echo ", PowerSGD rank $psgd_rank from step $psgd_start")"
printf '%-6s %-9s %-10s %-10s %s\n' round mode accuracy 'images/s' 'rank-0 train CPU s'
: >"$tmp/table"
for i in $(seq 1 "$rounds"); do
  for mode in ddp gradsync; do
    echo "# $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg): round $i, $mode" >&2
    r=$("run_$mode" "$i")
    if [ "$r" = FAILED ] && [ "$mode" = ddp ] && [ "$psgd_rank" -gt 0 ]; then
      why=$(grep -h -m1 -o 'what():.*' "$tmp/ddp-$i"-rank-*.log | head -1 || true)
      printf '%-6s %-9s %s\n' "$i" "$mode" "ABORTED with powerSGD_hook: ${why:-see its output}"
      continue
    fi
    if [ "$r" = FAILED ]; then
      echo "ddp_vs_gradsync: $mode run $i failed; its output:" >&2
      if [ "$mode" = ddp ]; then tail -n 20 "$tmp/ddp-$i"-rank-*.log >&2; else tail -n 20 "$tmp/gs-$i.log" >&2; fi
      exit 1
    fi
    read -r acc ips cpu <<<"$r"
    printf '%-6s %-9s %-10s %-10s %s\n' "$i" "$mode" "$acc" "$ips" "$cpu"
    echo "$mode $acc $ips" >>"$tmp/table"
  done
done
"$py" - "$tmp/table" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for mode in ("ddp", "gradsync"):
    acc = [float(r[1]) for r in rows if r[0] == mode]
    ips = [float(r[2]) for r in rows if r[0] == mode]
    if not acc:
        print(f"median {mode:9s} (no run completed)")
        continue
    med[mode] = (statistics.median(acc), statistics.median(ips))
    print(f"median {mode:9s} accuracy {100 * med[mode][0]:.2f} %  {med[mode][1]:.1f} images/s")
if len(med) < 2:
    sys.exit(0)
d, g = med["ddp"], med["gradsync"]
print(f"gradsync/DDP: images/s {g[1] / d[1]:.2f}x, accuracy {100 * (g[0] - d[0]):+.2f} points")
EOF
