#!/usr/bin/env bash
# Worker layouts on the machine it runs on: which split of its cores between DataLoader workers and
# decode threads feeds a training loop fastest. `act` mode (two 480p AV1 cameras, two frames each,
# a 50-step action chunk), uint8, batch 16, converted-local, batches through slabs; one round.
#
#   bash benchmarks/layouts.sh [OUT]      # default OUT: benchmarks/results/layouts-<cores>c
#
# Cases (n = usable cores): workers 0 with the default decode threads (one per core, at most 8) and
# with n-2 threads; workers n/4, n/2 and n-2 with the default threads in a worker (n // workers,
# at most 8); n/4 and n/2 with 2 decode threads each; the limits once. Environment: SIZE (dataset, default `wide`; `tiny` for a
# smoke test), SECONDS_PER_CASE (default 8), PYTHON (default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-}
[[ -n "$py" ]] || { [[ -x .venv/bin/python ]] && py=.venv/bin/python || py=python3; }
n=$("$py" -c "from lerobot_shards.cpus import usable_cpus; print(usable_cpus())")
out=${1:-benchmarks/results/layouts-${n}c}
size=${SIZE:-wide}
quarter=$((n / 4 > 1 ? n / 4 : 1))
half=$((n / 2 > 1 ? n / 2 : 1))
most=$((n - 2 > 1 ? n - 2 : 1))
workers=$(printf '%s\n' "$quarter" "$half" "$most" | sort -nu | paste -sd, -)
common=(--size "$size" --decodes cpu --modes act --sources converted-local --transports slab --rounds 1
        --max-seconds "${SECONDS_PER_CASE:-8}" --batches 400 --warmup-batches "$n" --no-baselines --no-summary
        --out "$out")
echo "== layouts on $n cores: workers 0,$workers; results in $out"
"$py" benchmarks/bench.py "${common[@]}" --no-limits --workers "0,$workers"
"$py" benchmarks/bench.py "${common[@]}" --no-limits --workers "$(printf '%s\n' "$quarter" "$half" | sort -nu | paste -sd, -)" \
    --opt decode_threads=2 --label dt2
# with the limits (the pure-decode rate per core, the DataLoader ceiling) once, at workers 0
"$py" benchmarks/bench.py "${common[@]}" --workers 0 --opt "decode_threads=$most" --label "dt$most"
"$py" benchmarks/summarize.py "$out"
