# Copied into .gpu/ by benchmarks/gpu/make_bundle.sh. Source it from the repo root on the GPU machine:  . .gpu/setup.sh
# Installs the carried wheels into /tmp/site, exposes PyAV's bundled FFmpeg 8.1 libraries under
# their plain sonames (libavcodec.so.62, ...) for torchcodec, and reports what it found.
# Never aborts the calling shell: every failure is printed instead.
_gpu_dir="$PWD/.gpu"
_site=${GPU_SITE:-/tmp/site}
echo "== gpu setup: $(date -u +%H:%M:%S) in $PWD"
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_site" "$_gpu_dir"/whl/*.whl 2>&1 | grep -v -i "warning"; then :; fi
[ -d "$_site/torchcodec" ] || echo "!! gpu setup: wheel install into $_site failed (no torchcodec there)"
# Plain-soname links next to PyAV's hashed FFmpeg libs, so libtorchcodec_core8.so finds the same files PyAV uses.
if [ -d "$_site/av.libs" ]; then
  for _f in "$_site"/av.libs/lib{avutil,avcodec,avformat,avdevice,avfilter,swscale,swresample}-*.so.*; do
    [ -e "$_f" ] || continue
    _b=$(basename "$_f"); _n=${_b%%-*}; _maj=$(echo "$_b" | sed -E 's/.*\.so\.([0-9]+).*/\1/')
    ln -sf "$_b" "$_site/av.libs/$_n.so.$_maj"
  done
else
  echo "!! gpu setup: $_site/av.libs missing (PyAV wheel not installed?)"
fi
export PYTHONPATH="$_site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$_site/av.libs:$_gpu_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The carried torchcodec is a CUDA build (needs libtorch_cuda, libcudart.so.13, .gpu/lib/libnppicc.so.13);
# if it cannot load here, fall back to PyPI's CPU-only build so CPU decode still works.
if ! python3 -c "from torchcodec import _core" >/dev/null 2>&1; then
  echo "!! gpu setup: CUDA torchcodec failed to load:"; python3 -c "from torchcodec import _core" 2>&1 | tail -3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_site" "$_gpu_dir"/cpu-fallback/*.whl 2>&1 | grep -v -i warning
  echo "!! gpu setup: installed the CPU-only torchcodec instead (device='cuda' will be refused)"
fi
echo "PYTHONPATH=$PYTHONPATH"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi -L 2>&1 || echo "!! nvidia-smi failed"
echo "-- driver video libs (NVDEC needs libnvcuvid.so.1):"
{ ldconfig -p 2>/dev/null | grep -E "libnvcuvid|libcuda\.so\.1" ; ls /usr/local/nvidia/lib64 2>/dev/null | grep -E "nvcuvid|libcuda\.so" ; } | sort -u || true
python3 - <<'EOF' 2>&1 || echo "!! gpu setup: python probe failed"
import os, sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda.is_available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:
    print("!! torch:", repr(e))
try:
    import torchcodec
    print("torchcodec", torchcodec.__version__, "from", os.path.dirname(torchcodec.__file__))
    from torchcodec import _core  # noqa: F401  (loads libtorchcodec_coreN)
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libav" in l or "torchcodec_core" in l
                   or "nppicc" in l or "nvcuvid" in l})
    print("loaded:", *libs, sep="\n  ")
except Exception as e:
    print("!! torchcodec:", repr(e))
for name in ("av", "webdataset", "braceexpand", "lerobot_shards"):
    try:
        m = __import__(name)
        print(name, getattr(m, "__version__", ""), "ok")
    except Exception as e:
        print("!!", name, repr(e))
EOF
unset _gpu_dir _site _f _b _n _maj
