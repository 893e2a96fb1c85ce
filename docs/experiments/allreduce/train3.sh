#!/usr/bin/env bash
# Used for the training rows of 2026-12-03-shm.md. Each spec is label:binary:transport.
# train3.sh ROUNDS MODEL STEPS label:bin:transport ...
rounds=$1; model=$2; steps=$3; shift 3
for r in $(seq $rounds); do for spec in "$@"; do
  IFS=: read label bin t <<<"$spec"
  d=$(mktemp -d ${TMPDIR:-/tmp}/gs-runs.XXXX)
  $bin local --mode ring --workers 2 --model $model --max-steps $steps --transport $t --runs-dir $d >/dev/null 2>&1
  s=$(ls $d/*/summary.json); m=$(ls $d/*/metrics.jsonl)
  ips=$(python3 -c "import json;print(round(json.load(open('$s'))['images_per_second']))")
  cs=$(grep '"kind":"progress"' $m | tail -1 | python3 -c "import json,sys;d=json.loads(sys.stdin.read());print(round(d['compute_seconds']*1000,2), round(d['left_wait_seconds']*1000,2))")
  echo "round=$r $label model=$model img/s=$ips compute_ms/lwait_ms=$cs load=$(cut -d' ' -f1 /proc/loadavg)"
  rm -rf $d
done; done
