#!/usr/bin/env bash
# Build `.gpu/`, what a GPU machine without network needs to run benchmarks/gpu_check.sh:
# Python 3.12 wheels (PyAV, whose bundled FFmpeg 8.1 torchcodec loads; webdataset; braceexpand),
# NPP 13 libraries, and a CUDA-enabled torchcodec. Versions are pinned here, and every file fetched
# must match its sha256 in benchmarks/gpu/pins.sha256; nothing built or fetched is kept in git.
#
# PyPI's torchcodec wheels are CPU-only (`device="cuda"` fails with "Unsupported device"). The CUDA
# build (torchcodec 0.11.1 for torch 2.11 + CUDA 13.0, what the GPU image has) is published on the
# PyTorch wheel index, fetched from TORCHCODEC_CUDA_INDEX (default below), or given as a file:
# TORCHCODEC_CUDA_WHEEL=/path/to/torchcodec-0.11.1+cu130-...whl. Its sha256 must be in pins.sha256
# too: the first time, the script prints the line to add (check the file's origin first). Without a
# CUDA wheel the bundle carries the CPU build, and gpu_check.sh reports CUDA decoding as unavailable.
# Run on a machine with network, from the repository root:
#
#   bash benchmarks/gpu/make_bundle.sh        # writes .gpu/ (git-ignored, ~44 MiB)
#
# then on the GPU machine, with `.gpu` carried:  . .gpu/setup.sh; python3 .gpu/probe_decode.py;
# bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pins=$PWD/benchmarks/gpu/pins.sha256
dst=.gpu
index=${TORCHCODEC_CUDA_INDEX:-https://download.pytorch.org/whl/cu130}
plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

check() {  # every wheel in DIR is pinned and matches
  local dir=$1 f
  for f in "$dir"/*.whl; do
    grep -q "  $(basename "$f")\$" "$pins" || {
      echo "make_bundle: $(basename "$f") is not pinned; if you trust its origin, add to $pins:" >&2
      (cd "$dir" && sha256sum "$(basename "$f")") >&2
      return 1
    }
  done
  (cd "$dir" && sha256sum --quiet -c --ignore-missing "$pins")
}

rm -rf "$dst"
mkdir -p "$dst/whl" "$dst/lib" "$dst/cpu-fallback" "$dst/cuda"
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
python3 -m pip download -q "${plat[@]}" -d "$dst/whl" av==18.1.0 webdataset==1.0.2 braceexpand==0.1.7
python3 -m pip download -q "${plat[@]}" -d "$dst/cpu-fallback" torchcodec==0.11.1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q "${plat[@]}" -d "$tmp" nvidia-npp==13.0.1.2
check "$dst/whl"; check "$dst/cpu-fallback"; check "$tmp"
unzip -q -o -j "$tmp"/nvidia_npp-*.whl 'nvidia/cu13/lib/libnppc.so.13' 'nvidia/cu13/lib/libnppicc.so.13' -d "$dst/lib"
if [ -n "${TORCHCODEC_CUDA_WHEEL:-}" ]; then
  cp "$TORCHCODEC_CUDA_WHEEL" "$dst/cuda/"
elif ! python3 -m pip download -q "${plat[@]}" --index-url "$index" -d "$dst/cuda" torchcodec==0.11.1; then
  echo "make_bundle: no CUDA torchcodec from $index; the bundle carries the CPU build only" >&2
fi
if compgen -G "$dst/cuda/*.whl" >/dev/null; then
  check "$dst/cuda"
  mv "$dst"/cuda/*.whl "$dst/whl/"
else
  cp "$dst"/cpu-fallback/*.whl "$dst/whl/"
fi
rmdir "$dst/cuda"
cp benchmarks/gpu/setup.sh benchmarks/gpu/probe_decode.py "$dst/"
du -sh "$dst"
