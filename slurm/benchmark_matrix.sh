#!/bin/bash
# The loader benchmark matrix as isolated single-GPU SLURM jobs, then one summary.
#
#   SOURCES=converted-local,converted-bucket MODES=act DECODES=cpu,cuda WORKERS=4,8 \
#       ACCOUNT=myacct PARTITION=gpu bash slurm/benchmark_matrix.sh [bench.py options]
#
# One job builds the dataset (DATA_DIR, on a shared file system), then one job per
# (source, mode, decode, workers) runs benchmarks/bench.py on one GPU with its own bucket and
# shaper, writing its case JSONs into RESULTS; a failure or an OOM kill shows in that job's JSON
# or log and never stops the others. One job per mode runs the LeRobot baselines and the limits.
# A last job (afterany) runs summarize.py on RESULTS.
#
# Environment: SOURCES, MODES, DECODES, WORKERS (comma lists; defaults: the whole matrix),
# CUDA_WORKERS (workers for cuda cases, default 2: each holds a CUDA context and NVDEC sessions),
# SIZE (quick|full, default full), RESULTS (default benchmarks/results/slurm-<date>), DATA_DIR,
# ACCOUNT, PARTITION, TIME (per job, default 01:00:00), CPUS (per job, default 16), VENV,
# DRY_RUN=1 (print the sbatch commands instead of submitting).
set -euo pipefail

SOURCES=${SOURCES:-raw-local,converted-local,raw-bucket,converted-bucket,converted-bucket-warm}
MODES=${MODES:-frame,act,long}
DECODES=${DECODES:-cpu,cuda}
WORKERS=${WORKERS:-4,8}
CUDA_WORKERS=${CUDA_WORKERS:-2}
SIZE=${SIZE:-full}
RESULTS=${RESULTS:-benchmarks/results/slurm-$(date +%Y%m%d-%H%M)}
DATA_DIR=${DATA_DIR:-data/bench}
TIME=${TIME:-01:00:00}
CPUS=${CPUS:-16}
PY=${VENV:+$VENV/bin/}python

common=(--parsable --nodes=1 --ntasks=1 --cpus-per-task="$CPUS" --time="$TIME" --output="$RESULTS/logs/%x-%j.log")
[[ -n "${ACCOUNT:-}" ]] && common+=(--account="$ACCOUNT")
[[ -n "${PARTITION:-}" ]] && common+=(--partition="$PARTITION")
# the full dataset's cases need longer than bench.py's quick-matrix timeout (120 s); "$@" can override
bench=("$PY" benchmarks/bench.py --size "$SIZE" --data-dir "$DATA_DIR" --out "$RESULTS" --no-summary --timeout 600 "$@")

submit() {  # submit NAME DEPENDENCY COMMAND...: prints the job id
    local name=$1 dep=$2
    shift 2
    local cmd=(sbatch "${common[@]}" --job-name="bench-$name" --gres=gpu:1)
    [[ -n "$dep" ]] && cmd+=(--dependency="$dep")
    cmd+=(--wrap "$(printf '%q ' "$@")")
    if [[ -n "${DRY_RUN:-}" ]]; then
        printf '%q ' "${cmd[@]}" >&2
        echo >&2
        echo "dry$RANDOM"
    else
        "${cmd[@]}"
    fi
}

mkdir -p "$RESULTS/logs"
prepare=$(submit prepare "" "${bench[@]}" --prepare-only)
jobs=()
IFS=, read -r -a modes <<<"$MODES"
IFS=, read -r -a sources <<<"$SOURCES"
IFS=, read -r -a decodes <<<"$DECODES"
IFS=, read -r -a workers <<<"$WORKERS"
for mode in "${modes[@]}"; do
    for source in "${sources[@]}"; do
        for decode in "${decodes[@]}"; do
            for w in "${workers[@]}"; do
                [[ "$decode" == cuda ]] && w=$CUDA_WORKERS
                jobs+=("$(submit "$source-$mode-$decode-w$w" "afterok:$prepare" "${bench[@]}" --sources "$source" \
                    --modes "$mode" --decodes "$decode" --workers "$w" --cuda-workers "$CUDA_WORKERS" \
                    --no-baselines --no-limits)")
                [[ "$decode" == cuda ]] && break  # one cuda job per source and mode
            done
        done
    done
    jobs+=("$(submit "baselines-$mode" "afterok:$prepare" "${bench[@]}" --sources "" --modes "$mode" --workers "$WORKERS")")
done
deps=$(IFS=:; echo "${jobs[*]}")
summary=$(submit summary "afterany:$deps" "$PY" benchmarks/summarize.py "$RESULTS")
echo "submitted ${#jobs[@]} benchmark jobs after $prepare; summary job $summary writes $RESULTS/summary.md"
