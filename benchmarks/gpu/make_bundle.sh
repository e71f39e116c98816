#!/usr/bin/env bash
# Build `.gpu/`, what a GPU machine without network needs to run benchmarks/gpu_check.sh:
# Python 3.12 wheels (PyAV, whose bundled FFmpeg 8.1 torchcodec loads; webdataset; braceexpand),
# NPP 13 libraries, and a CUDA-enabled torchcodec.
#
# Why a wheel is committed here: PyPI's torchcodec wheels are CPU-only (`device="cuda"` fails with
# "Unsupported device"); the CUDA builds live on the PyTorch index. wheels/torchcodec-0.11.1-*.whl
# was built from torchcodec v0.11.1 with CUDA enabled, against PyPI's torch 2.11.0+cu130 (what the
# GPU image has), the CUDA 13.0 compiler and NPP wheels, and FFmpeg 8.1 headers (so it loads
# PyAV 18.1's FFmpeg 8.1). Run on this machine (with network), from the repository root:
#
#   bash benchmarks/gpu/make_bundle.sh        # writes .gpu/ (git-ignored, ~44 MiB)
#
# then on the GPU machine, with `.gpu` carried:  . .gpu/setup.sh; python3 .gpu/probe_decode.py;
# bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
here=benchmarks/gpu
dst=.gpu
plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$dst/whl" "$dst/lib" "$dst/cpu-fallback"
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
python3 -m pip download -q "${plat[@]}" -d "$dst/whl" av==18.1.0 webdataset==1.0.2 braceexpand==0.1.7
python3 -m pip download -q "${plat[@]}" -d "$dst/cpu-fallback" torchcodec==0.11.1
tmp=$(mktemp -d)
python3 -m pip download -q "${plat[@]}" -d "$tmp" nvidia-npp==13.0.1.2
unzip -q -o -j "$tmp"/nvidia_npp-*.whl 'nvidia/cu13/lib/libnppc.so.13' 'nvidia/cu13/lib/libnppicc.so.13' -d "$dst/lib"
rm -rf "$tmp"
cp "$here"/wheels/torchcodec-*.whl "$dst/whl/"
cp "$here/setup.sh" "$here/probe_decode.py" "$dst/"
du -sh "$dst"
