"""Device probe: does torchcodec decode on CUDA here, and does it match CPU decode?

Usage (after `. .gpu/setup.sh`): python3 .gpu/probe_decode.py [video.mp4 ...]
Without arguments it encodes two small test clips with PyAV (h264 via libx264, AV1 via SVT-AV1).
For each clip and each device/backend it prints frames/s and the max abs pixel error against CPU.
"""

import os
import sys
import time

os.environ.setdefault("SVT_LOG", "1")  # quiet SVT-AV1 encoder banner
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # one-line errors, not C++ stack dumps
import av  # noqa: E402
import numpy as np
import torch
from torchcodec.decoders import VideoDecoder, set_cuda_backend


def make_clip(path: str, codec: str, n: int = 90, w: int = 640, h: int = 480) -> str:
    with av.open(path, "w") as out:
        s = out.add_stream(codec, rate=30)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            img = np.zeros((h, w, 3), np.uint8)
            img[:, :, 0] = (np.arange(w) + 3 * i) % 256
            img[:, :, 1] = (np.arange(h)[:, None] + 5 * i) % 256
            img[(i * 4) % h : (i * 4) % h + 40, :, 2] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return path


def run(path: str, device: str, backend: str | None) -> torch.Tensor:
    def go():
        dec = VideoDecoder(path, device=device)
        idx = list(range(0, len(dec), 3))
        t = time.perf_counter()
        frames = dec.get_frames_at(indices=idx).data
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return frames, len(idx) / (time.perf_counter() - t), str(dec.cpu_fallback)

    if backend:
        with set_cuda_backend(backend):
            frames, fps, fallback = go()
    else:
        frames, fps, fallback = go()
    print(
        f"  {device:5} {backend or '':6} ok  {tuple(frames.shape)} on {frames.device}  {fps:8.1f} frames/s  [{fallback}]"
    )
    return frames.cpu()


clips = sys.argv[1:] or [make_clip("/tmp/probe_h264.mp4", "libx264"), make_clip("/tmp/probe_av1.mp4", "libsvtav1")]
for clip in clips:
    print(clip)
    ref = run(clip, "cpu", None)
    for backend in ("ffmpeg", "beta"):
        try:
            got = run(clip, "cuda", backend)
            err = (got.int() - ref.int()).abs()
            print(f"        vs cpu: max abs err {err.max().item()}, mean {err.float().mean().item():.3f}")
        except Exception as e:  # report and carry on: this is a probe
            print(f"  cuda  {backend:6} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
