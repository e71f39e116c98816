#!/usr/bin/env bash
# Everything one GPU lease checks, in one command (a lease is short and each start costs minutes).
# On the GPU machine, from the repository root, with `.gpu` (benchmarks/gpu/make_bundle.sh) carried:
#
#   bash benchmarks/gpu/run_all.sh        # results in $OUT (or benchmarks/gpu_results)
#
# 1. `. .gpu/setup.sh` (skipped when SETUP=0, e.g. where the packages are installed);
# 2. benchmarks/gpu_check.sh within GPU_CHECK_BUDGET seconds (default 240): NVDEC identity and
#    rates where torchcodec is a CUDA build, pinned slabs, DeviceFeeder, train.py on the GPU;
# 3. benchmarks/layouts.sh within LAYOUT_BUDGET seconds (default 220): which split of this
#    machine's cores between workers and decode threads feeds a loop fastest.
# Results: setup.log, gpu_check.json/.log, layouts.log, layouts.md (the summary) and
# layouts.tgz (every case's JSON): at most 8 files, as the device tool brings back.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-benchmarks/gpu_results}
mkdir -p "$out"
if [[ "${SETUP:-1}" != 0 ]]; then
    # sourced (not piped: its exports must stay in this shell)
    . .gpu/setup.sh >"$out/setup.log" 2>&1
    cat "$out/setup.log"
fi
export PYTHON=${PYTHON:-python3}
GPU_CHECK_BUDGET=${GPU_CHECK_BUDGET:-240} bash benchmarks/gpu_check.sh
echo "== layouts $(date -u +%H:%M:%S)"
layouts=$(mktemp -d)/layouts
timeout --signal=TERM --kill-after=10 "${LAYOUT_BUDGET:-220}" bash benchmarks/layouts.sh "$layouts" >"$out/layouts.log" 2>&1
echo "layouts exit $?"
tail -n 40 "$out/layouts.log"
[[ -f "$layouts/summary.md" ]] && cp "$layouts/summary.md" "$out/layouts.md"
[[ -d "$layouts" ]] && tar czf "$out/layouts.tgz" -C "$(dirname "$layouts")" layouts
echo "== run_all done in ${SECONDS} s"
