#!/usr/bin/env bash
# Create (or check) the separate venv that runs the LeRobot 0.4.4 baseline of benchmarks/bench.py.
#
#   benchmarks/loader/setup_lerobot_venv.sh [DIR]      # default DIR: <repo>/.venv-lerobot
#
# LeRobot is never a dependency of lerobot-shards: it lives only in this venv, and the benchmark
# runs harness/run_lerobot.py with this venv's python as a subprocess. Idempotent: when DIR already
# holds the pinned versions it does nothing. Needs PyPI (pip as configured on the machine) and
# ~8 GB of disk (torch 2.9.1 wheels from PyPI bundle CUDA libraries).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${1:-$REPO/.venv-lerobot}"

LEROBOT=0.4.4
TORCH=2.9.1
TORCHVISION=0.24.1
TORCHCODEC=0.9.1

check() {
    "$DIR/bin/python" - "$LEROBOT" "$TORCH" "$TORCHVISION" "$TORCHCODEC" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(("lerobot", "torch", "torchvision", "torchcodec"), sys.argv[1:]))
have = {name: version(name).split("+")[0] for name in want}
import lerobot.datasets.lerobot_dataset, psutil  # noqa: E401,F401  (importable, not just installed)
sys.exit(0 if have == want else 1)
EOF
}

if [ -x "$DIR/bin/python" ] && check; then
    echo "LeRobot venv ready: $DIR (lerobot $LEROBOT, torch $TORCH, torchcodec $TORCHCODEC)"
    exit 0
fi

PY=""
for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] < (3, 13) else 1)'; then
        PY="$candidate"
        break
    fi
done
if [ -z "$PY" ]; then
    echo "no python 3.10-3.12 found: lerobot $LEROBOT needs one" >&2
    exit 1
fi

echo "creating $DIR with $($PY --version) (this downloads torch: several minutes)"
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install -q --upgrade pip
"$DIR/bin/python" -m pip install -q \
    "lerobot==$LEROBOT" "torch==$TORCH" "torchvision==$TORCHVISION" "torchcodec==$TORCHCODEC" psutil

if check; then
    echo "LeRobot venv ready: $DIR"
else
    echo "installed, but the version check failed in $DIR:" >&2
    "$DIR/bin/python" -m pip list 2>/dev/null | grep -Ei '^(lerobot|torch|torchvision|torchcodec|psutil) ' >&2 || true
    exit 1
fi
