#!/usr/bin/env bash
# One prepared GPU check, under 5 minutes on one GPU machine (see benchmarks/gpu_check.py):
# NVDEC frame identity against CPU decoding, CPU vs CUDA (nvdec and ffmpeg backends) frames/s,
# VRAM per decoder and per worker, DeviceFeeder throughput and equality, AV1 fallback.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, on the GPU machine
#   bash benchmarks/gpu_check.sh --quick    # tiny sizes (smoke test; on CPU it says "no CUDA")
#
# Uses .venv/bin/python when it has torch, else python3. Reports what it finds (torch and
# torchcodec builds, FFmpeg, GPU) and installs this package with `pip install -e . --no-deps`
# only if it is not importable (falling back to PYTHONPATH=src). Needs no network. Results go
# to $OUT (when set) or benchmarks/gpu_results/: gpu_check.json, gpu_check.log.
# Environment: OUT, GPU_CHECK_BUDGET (total seconds, default 290), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
budget=${GPU_CHECK_BUDGET:-290}
out=${OUT:-benchmarks/gpu_results}
mkdir -p "$out"
log="$out/gpu_check.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

py=${PYTHON:-}
if [[ -z "$py" ]]; then
    if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
        py=.venv/bin/python
    else
        py=python3
    fi
fi
say "== gpu_check $(date -u +%FT%TZ) on $(hostname), python: $py ($($py --version 2>&1))"
say "-- nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 4 | tr '\n' ';')"
say "-- ffmpeg: $(timeout 10 ffmpeg -version 2>&1 | head -n 1)"
say "-- libavcodec: $( (ldconfig -p 2>/dev/null | grep -o 'libavcodec\.so\.[0-9]*' | sort -u | tr '\n' ' ') || true)"
versions=$(timeout 180 "$py" - 2>&1 <<'PY'
import importlib
for name in ("torch", "torchcodec", "numpy", "pyarrow", "av", "fsspec", "webdataset", "click", "tqdm"):
    try:
        print(f"-- {name}: {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as e:
        print(f"-- {name}: MISSING ({type(e).__name__}: {e})")
try:
    import torch
    print(f"-- torch CUDA build {torch.version.cuda}, available {torch.cuda.is_available()}, GPUs {torch.cuda.device_count()}")
except Exception:
    pass
PY
)
say "$versions"

# This checkout's package: installed in editable mode if needed, else found through PYTHONPATH.
here="$PWD/src/lerobot_shards/__init__.py"
where() { timeout 120 "$py" -c "import lerobot_shards; print(lerobot_shards.__file__)" 2>/dev/null; }
if [[ -z "$(where)" ]]; then
    say "-- installing this package: $py -m pip install -e . --no-deps"
    timeout 120 "$py" -m pip install -q -e . --no-deps >>"$log" 2>&1 || say "-- pip install failed"
fi
if [[ "$(where)" != "$here" ]]; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
say "-- lerobot_shards from: $(where || echo 'NOT IMPORTABLE')"

left=$((budget - SECONDS - 10))
if ((left < 30)); then
    say "-- only ${left} s left after set-up: not running the checks"
    exit 1
fi
say "-- running the checks with ${left} s (results in $out)"
timeout --signal=TERM --kill-after=10 "$((left + 5))" \
    "$py" benchmarks/gpu_check.py --out "$out" --budget "$((left - 15))" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
say "== gpu_check done in ${SECONDS} s, exit ${rc}"
exit "$rc"
