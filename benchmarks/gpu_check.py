"""The GPU check behind ``benchmarks/gpu_check.sh``: NVDEC identity, decode rates, feeder, VRAM.

Synthesizes an identity-painted AV1 dataset (LeRobot's codec), converts it with
``--reencode h264 --gop 2`` and then, each section on its own and each within the time left:

- ``env``: versions, GPU, whether torch and torchcodec are CUDA builds.
- ``identity/<backend>``: CUDA-decoded frames carry the (episode, frame) painted into them and
  their pixels' distance to the CPU-decoded ones (NVDEC's YUV->RGB differs from swscale's).
- ``decode/<device>``: loader frames/s with random access (windows of 2 frames, as in training)
  and sequential frames/s of one clip, CPU against both CUDA backends.
- ``vram``: device memory per decoder and per spawned DataLoader worker (its CUDA context).
- ``feeder``: batches equal the float32 loader's; samples/s of DeviceFeeder against a float32
  loader moved to the GPU in the loop; also with decoding on the GPU in the feeder's thread.
- ``av1_fallback``: the raw AV1 dataset on CUDA warns once and still reads the right frames
  (Hopper NVDEC has no AV1), and ``strict_cuda_decode=True`` refuses.

Without CUDA it runs the CPU parts and says "no CUDA". Results: ``gpu_check.json`` (rewritten
after every section, so a timeout keeps what finished) and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

CAM = "observation.images.front"


class Check:
    """Runs sections against a deadline and keeps the JSON report current."""

    def __init__(self, out: Path, budget_s: float, quick: bool) -> None:
        self.out, self.quick = out, quick
        self.deadline = time.monotonic() + budget_s
        self.report: dict[str, Any] = {"quick": quick, "budget_s": budget_s, "sections": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn: Callable[[], Any], need_s: float = 5.0) -> Any:
        entry: dict[str, Any]
        if self.left() < need_s:
            entry = {"status": "skipped", "why": f"{self.left():.0f} s left, needs ~{need_s:.0f} s"}
            result = None
        else:
            start = time.monotonic()
            try:
                result = fn()
                entry = {"status": "ok", "result": result}
            except Exception as e:  # every section on its own: report and go on
                result = None
                entry = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            entry["seconds"] = round(time.monotonic() - start, 2)
        self.report["sections"][name] = entry
        self.save()
        line = entry.get("error") or entry.get("why") or _short(entry.get("result"))
        print(f"[{name}] {entry['status']}: {line}", flush=True)
        return result

    def save(self) -> None:
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2, default=str))
        os.replace(tmp, self.out / "gpu_check.json")


def _short(result: Any) -> str:
    text = json.dumps(result, default=str)
    return text if len(text) < 300 else text[:297] + "..."


def _dataset(root: Path, **kwargs: Any):
    from lerobot_shards.loader import EpisodePoolDataset

    kwargs.setdefault("delta_timestamps", {CAM: [-1 / 30, 0.0]})
    kwargs.setdefault("image_dtype", torch.uint8)
    kwargs.setdefault("episode_pool_size", 4)
    kwargs.setdefault("seed", 0)
    return EpisodePoolDataset(str(root), **kwargs)


def _timed(
    make_iter: Callable[[int], Iterable[Any]], seconds: float, count: Callable[[Any], int], skip: int = 1
) -> dict[str, float]:
    """Steady items/s over passes (epochs) until ``seconds``.

    Each pass's first ``skip`` items (one per DataLoader worker: their start-up) are left out.
    """
    start = time.perf_counter()
    first = None
    n, busy, epoch = 0, 0.0, 0
    while time.perf_counter() - start < seconds:
        began = last = None
        for i, item in enumerate(make_iter(epoch)):
            last = time.perf_counter()
            if first is None:
                first = last - start
            if i + 1 == skip:
                began = last
            elif i >= skip:
                n += count(item)
            if last - start > seconds:
                break
        if began is None:
            break  # an empty pass
        busy += last - began
        epoch += 1
    return {"per_s": round(n / busy, 1) if busy else 0.0, "items": n, "first_s": round(first or 0.0, 3)}


def _timed_cpu(
    make_iter: Callable[[int], Iterable[Any]], seconds: float, count: Callable[[Any], int], skip: int
) -> dict[str, Any]:
    """``_timed``'s samples/s and first item, with the main process's CPU ms per item (its threads included)."""
    cpu0 = time.process_time()
    got = _timed(make_iter, seconds, count, skip=skip)
    cpu_ms = 1000 * (time.process_time() - cpu0) / max(1, got["items"])
    return {"samples_per_s": got["per_s"], "first_s": got["first_s"], "main_cpu_ms_per_sample": round(cpu_ms, 2)}


def section_env() -> dict[str, Any]:
    import torchcodec

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "torchcodec": torchcodec.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        free, total = torch.cuda.mem_get_info(0)
        info["vram_free_gib"], info["vram_total_gib"] = round(free / 2**30, 1), round(total / 2**30, 1)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.used", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"] = f"unavailable ({e})"
    return info


def section_data(work: Path, quick: bool) -> dict[str, Any]:
    from lerobot_shards.synth import synth_dataset

    episodes, length, (h, w) = (4, 12, (64, 160)) if quick else (24, 40, (480, 640))
    start = time.perf_counter()
    kwargs: dict[str, Any] = dict(
        num_episodes=episodes, cameras=(CAM,), height=h, width=w, length_range=(length, length)
    )
    try:
        raw, codec = synth_dataset(work / "raw_av1", codec="av1", **kwargs), "av1"  # LeRobot's codec
    except Exception as e:  # an FFmpeg build without an AV1 encoder: go on with H.264
        print(f"AV1 synthesis failed ({e}); using H.264", flush=True)
        raw, codec = synth_dataset(work / "raw_h264", codec="h264", **kwargs), "h264"
    synth_s = time.perf_counter() - start
    start = time.perf_counter()
    conv = work / "conv_h264"
    workers = str(max(1, min(episodes, (os.cpu_count() or 2) - 1)))
    cli = "from lerobot_shards.cli import main; main()"
    cmd = [sys.executable, "-c", cli, "convert", str(raw), str(conv), "--reencode", "h264"]
    cmd += ["--gop", "2", "--episodes-per-shard", "1", "--workers", workers, "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        raise RuntimeError(f"convert failed ({done.returncode}): {done.stderr[-2000:]}")
    if not (conv / "manifest.json").is_file():
        raise RuntimeError(f"convert wrote no manifest: {done.stdout[-1000:]} {done.stderr[-1000:]}")
    return {
        "raw": str(raw),
        "raw_codec": codec,
        "converted": str(conv),
        "episodes": episodes,
        "frames": episodes * length,
        "size": f"{w}x{h}",
        "synth_s": round(synth_s, 1),
        "convert_s": round(time.perf_counter() - start, 1),
    }


def cuda_decode_missing(conv: Path) -> str | None:
    """Why torchcodec cannot decode on this GPU (PyPI's torchcodec wheels are CPU builds), or ``None``."""
    try:
        from torchcodec.decoders import VideoDecoder

        from lerobot_shards.loader.read.sources import open_source

        ds = _dataset(conv)
        source = open_source(str(conv))
        try:
            clip = source.read_episode(ds.shards[0].index, ds.shards[0].episodes[0]).clips[CAM]
            VideoDecoder(clip.data, device="cuda:0", custom_frame_mappings=clip.frame_mappings).get_frames_at([0])
        finally:
            source.close()
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def section_identity(conv: Path, backend: str, quick: bool) -> dict[str, Any]:
    from lerobot_shards.synth import read_identity

    n = 32 if quick else 128
    cpu = iter(_dataset(conv, video_decode_device="cpu"))
    gpu = iter(_dataset(conv, video_decode_device="cuda", cuda_decode_backend=backend))
    wrong, diffs, exact, pixels, max_diff = [], [], 0, 0, 0
    for _ in range(n):
        a, b = next(cpu), next(gpu)
        assert a["index"] == b["index"], "the CPU and CUDA loaders emitted different samples"
        key = (int(b["episode_index"]), int(b["frame_index"]))
        got = read_identity(b[CAM][-1])
        if got != key:
            wrong.append({"expected": key, "read": got})
        d = (a[CAM].int() - b[CAM].cpu().int()).abs()
        diffs.append(d.float().mean().item())
        exact += int((d == 0).sum())
        pixels += d.numel()
        max_diff = max(max_diff, int(d.max()))
    return {
        "samples": n,
        "device_of_frames": str(b[CAM].device),
        "identity_mismatches": len(wrong),
        "first_mismatches": wrong[:5],
        "pixel_max_abs_diff": max_diff,
        "pixel_mean_abs_diff": round(sum(diffs) / len(diffs), 3),
        "pixels_identical": round(exact / pixels, 4),
    }


def section_decode(conv: Path, device: str, backend: str, seconds: float, workers: int) -> dict[str, Any]:
    ds = _dataset(conv, video_decode_device=device, cuda_decode_backend=backend)
    spawn = device != "cpu" and workers > 0

    def epoch(e: int) -> Iterable[Any]:
        ds.set_epoch(e)
        return DataLoader(ds, batch_size=16, num_workers=workers, multiprocessing_context="spawn" if spawn else None)

    loader = _timed(epoch, seconds, lambda b: b[CAM].shape[0] * b[CAM].shape[1], skip=max(1, workers))
    result: dict[str, Any] = {
        "workers": workers,
        "loader_random_frames_per_s": loader["per_s"],
        "first_batch_s": loader["first_s"],
    }
    # Sequential decoding of one clip: the decoder's peak rate, no seeks.
    from torchcodec.decoders import VideoDecoder

    from lerobot_shards.loader.decoding.decoders import _enter_cuda_backend
    from lerobot_shards.loader.read.sources import open_source

    source = open_source(str(conv))
    clip = source.read_episode(ds.shards[0].index, ds.shards[0].episodes[0]).clips[CAM]
    source.close()
    with contextlib.ExitStack() as stack:
        if device != "cpu":
            _enter_cuda_backend(stack, backend)
        decoder = VideoDecoder(clip.data, device=ds.video_decode_device, custom_frame_mappings=clip.frame_mappings)
    frames = len(decoder)
    decoder.get_frames_in_range(0, frames)  # warm
    if device != "cpu":
        torch.cuda.synchronize()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < min(3.0, seconds):
        n += decoder.get_frames_in_range(0, frames).data.shape[0]
    if device != "cpu":
        torch.cuda.synchronize()
    result["sequential_frames_per_s"] = round(n / (time.perf_counter() - start), 1)
    if device != "cpu":
        result["cpu_fallback"] = str(decoder.cpu_fallback)
    return result


def section_vram(conv: Path, backend: str, quick: bool) -> dict[str, Any]:
    from torchcodec.decoders import VideoDecoder

    from lerobot_shards.loader.decoding.decoders import _enter_cuda_backend
    from lerobot_shards.loader.read.sources import open_source

    torch.cuda.init()
    ds = _dataset(conv)
    source = open_source(str(conv))
    clips = [source.read_episode(s.index, s.episodes[0]).clips[CAM] for s in ds.shards]
    source.close()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # count the decoders, not blocks cached by the allocator
    free0 = torch.cuda.mem_get_info()[0]
    decoders = []
    for clip in clips:
        with contextlib.ExitStack() as stack:
            _enter_cuda_backend(stack, backend)
            d = VideoDecoder(clip.data, device="cuda:0", custom_frame_mappings=clip.frame_mappings)
        d.get_frames_at([0, 1])
        decoders.append(d)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1 = torch.cuda.mem_get_info()[0]
    per_decoder = (free0 - free1) / len(decoders) / 2**20
    del decoders
    torch.cuda.empty_cache()
    result = {"decoders": len(clips), "mib_per_decoder": round(per_decoder, 1)}
    # A spawned worker that decodes on CUDA also holds its own CUDA context.
    workers = 2
    loader = DataLoader(
        _dataset(conv, video_decode_device="cuda", cuda_decode_backend=backend),
        batch_size=4,
        num_workers=workers,
        multiprocessing_context="spawn",
    )
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    lowest = free_before
    for i, _ in enumerate(loader):
        lowest = min(lowest, torch.cuda.mem_get_info()[0])
        if i >= (4 if quick else 16):
            break
    result["mib_per_worker_process"] = round((free_before - lowest) / workers / 2**20, 1)
    return result


def section_feeder(conv: Path, seconds: float, workers: int, cuda_decode: bool) -> dict[str, Any]:
    from lerobot_shards.loader import DeviceFeeder

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def loader(dtype: torch.dtype, decode: str = "cpu", num_workers: int = workers) -> DataLoader:
        ds = _dataset(
            conv,
            image_dtype=dtype,
            video_decode_device=decode,
            delta_timestamps={CAM: [-1 / 30, 0.0], "action": [i / 30 for i in range(10)]},
        )
        return DataLoader(ds, batch_size=16, num_workers=num_workers)

    # Equality: the feeder's batches (uint8 -> float on the device) against the float32 loader's.
    mismatched = []
    for i, (a, b) in enumerate(zip(DeviceFeeder(loader(torch.uint8), device), loader(torch.float32))):
        for key, value in b.items():
            if isinstance(value, torch.Tensor) and not (
                a[key].dtype == value.dtype and torch.equal(a[key].cpu(), value)
            ):
                mismatched.append(f"batch {i} {key}")
        if i >= 3:
            break
    result: dict[str, Any] = {
        "device": device,
        "equal_to_float32_loader": not mismatched,
        "mismatches": mismatched[:10],
    }

    def count(b: Any) -> int:
        return len(b["index"])

    def epochs(make: Callable[[], Iterable[Any]], ds_loader: DataLoader) -> Callable[[int], Iterable[Any]]:
        def it(e: int) -> Iterable[Any]:
            ds_loader.dataset.set_epoch(e)
            return make()

        return it

    def synced(batches: Iterable[Any]) -> Iterator[Any]:
        """Each batch counts once it is on the device (the feeder's copies are asynchronous)."""
        for b in batches:
            if device != "cpu":
                torch.cuda.current_stream().synchronize()
            yield b

    feed_loader = loader(torch.uint8)
    feeder = DeviceFeeder(feed_loader, device, prefetch=4)
    fed = _timed(epochs(lambda: synced(feeder), feed_loader), seconds, count, skip=max(1, workers))
    result["feeder_samples_per_s"] = fed["per_s"]
    result["feeder_wait"] = feeder.stats()

    float_loader = loader(torch.float32)

    def moved() -> Iterator[Any]:
        for b in float_loader:
            yield {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}

    plain = _timed(epochs(lambda: synced(moved()), float_loader), seconds, count, skip=max(1, workers))
    result["float32_loader_to_device_samples_per_s"] = plain["per_s"]
    result["ratio"] = round(fed["per_s"] / plain["per_s"], 2) if plain["per_s"] else None
    if cuda_decode:
        gpu_loader = loader(torch.uint8, decode="cuda", num_workers=0)
        gpu_feeder = DeviceFeeder(gpu_loader, device, prefetch=4)
        gpu = _timed(epochs(lambda: synced(gpu_feeder), gpu_loader), seconds, count)
        result["feeder_gpu_decode_in_thread_samples_per_s"] = gpu["per_s"]
    return result


def _release_event(ds: Callable[[], Any]) -> dict[str, Any]:
    """A pinned slab stays busy while a ``non_blocking`` copy from it waits on a side stream, when
    the batch is dropped on that stream (its release event follows the copy); the control drops
    it on the default stream, whose event completes at once: the slab is freed mid-copy."""
    from lerobot_shards.loader import transport

    loader = DataLoader(
        ds(),
        batch_size=16,
        num_workers=2,
        collate_fn=transport.SlabCollate(6, pin_memory=True),
        pin_memory=True,
        prefetch_factor=2,
    )
    batches = iter(loader)
    side = torch.cuda.Stream()
    out: dict[str, Any] = {}
    for case, on_side in (("dropped_on_copy_stream", True), ("control_dropped_on_default_stream", False)):
        batch = next(batches)
        ptr = batch[CAM].untyped_storage().data_ptr()
        registry = transport._registry()
        with registry._lock:  # the pin thread adopts batches meanwhile
            entry = next(e for e in registry._slabs.values() if e.storage.data_ptr() == ptr)
        header = transport._header(entry.storage)
        generation = int(header[1])
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000_000)  # about 1 s of GPU time ahead of the copy
            copy = batch[CAM].to("cuda", non_blocking=True)
            if on_side:
                del batch
        if not on_side:
            del batch
        for _ in range(4):  # adopts in the pin thread drain the completed release events
            next(batches)
        mine = int(header[1]) == generation
        busy_mid_copy = mine and int(header[0]) == transport.BUSY
        side.synchronize()
        freed = False
        for _ in range(8):
            next(batches)
            if int(header[1]) != generation or int(header[0]) == transport.FREE:
                freed = True
                break
        out[case] = {"busy_while_copying": busy_mid_copy, "freed_after_copy": freed}
        del copy
    del batches
    return out


def section_slab(conv: Path, seconds: float) -> dict[str, Any]:
    """``SlabCollate(pin_memory=True)`` on this host: the slab path whose slabs are page-locked.

    Equality: every batch of an epoch equals a plain DataLoader's (default collate, ``pin_memory``),
    arrives pinned, and its ``non_blocking`` copy on the GPU equals it; a batch held for ten steps,
    while later batches are copied, keeps its values. Figures: samples/s and the main process's
    CPU ms per sample (its pin thread included) of a loop that copies every batch to the GPU, for
    the default collate with ``pin_memory``, slabs whose batches the pin thread copies into pinned
    memory, and pinned slabs.
    """
    from lerobot_shards.loader.transport.slabs import SlabCollate

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    n_workers = 2

    def ds():
        return _dataset(conv, delta_timestamps={CAM: [-1 / 30, 0.0], "action": [i / 30 for i in range(10)]})

    def plain_loader() -> DataLoader:
        return DataLoader(ds(), batch_size=16, num_workers=n_workers, pin_memory=cuda, prefetch_factor=4)

    def slabs(pin: bool) -> DataLoader:
        """Slabs; ``pin``: page-locked, else the DataLoader's pin thread copies each batch out."""
        collate = SlabCollate(6, pin_memory=cuda and pin)
        return DataLoader(
            ds(), batch_size=16, num_workers=n_workers, collate_fn=collate, pin_memory=cuda, prefetch_factor=4
        )

    mismatched, unpinned, gpu_mismatched, batches = [], 0, [], 0
    held: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None
    held_changed: list[str] | None = None  # None: the epoch was too short to hold a batch for 10 steps
    for i, (a, b) in enumerate(zip(plain_loader(), slabs(True), strict=True)):
        batches += 1
        if list(a) != list(b):
            mismatched.append(f"batch {i}: keys {list(a)} != {list(b)}")
        for key, value in a.items():
            if isinstance(value, torch.Tensor):
                if not (b[key].dtype == value.dtype and torch.equal(b[key], value)):
                    mismatched.append(f"batch {i} {key}")
                unpinned += cuda and not b[key].is_pinned()
                moved = b[key].to(device, non_blocking=True)
                if not torch.equal(moved.cpu(), value):
                    gpu_mismatched.append(f"batch {i} {key}")
            elif value != b[key]:
                mismatched.append(f"batch {i} {key} (not a tensor)")
        if i == 1:
            held = (b, {k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)})
        if held is not None and i == 11:
            held_changed = [k for k, v in held[1].items() if not torch.equal(held[0][k], v)]
            held = None
        del a, b
    result: dict[str, Any] = {
        "device": device,
        "batches": batches,
        "equal_to_plain_loader": not mismatched,
        "mismatches": mismatched[:10],
        "tensors_not_pinned": unpinned,
        "gpu_copies_equal": not gpu_mismatched,
        "gpu_mismatches": gpu_mismatched[:10],
        "held_batch_changed_keys": held_changed,
    }

    def count(b: Any) -> int:
        return len(b["index"])

    def rate(make: Callable[[], DataLoader]) -> dict[str, Any]:
        loaders: list[DataLoader] = []

        def it(e: int) -> Iterator[Any]:
            loader = make()
            loaders.append(loader)
            loader.dataset.set_epoch(e)
            for b in loader:
                moved = {k: v.to(device, non_blocking=True) for k, v in b.items() if isinstance(v, torch.Tensor)}
                del b
                if cuda:
                    torch.cuda.current_stream().synchronize()
                yield moved

        out = _timed_cpu(it, seconds, count, n_workers)
        collate = loaders[-1].collate_fn if loaders else None
        if isinstance(collate, SlabCollate):
            out["transport"] = collate.stats()
        return out

    if cuda:
        try:
            result["release_event"] = _release_event(ds)
        except Exception as e:  # the rest of the section still runs
            result["release_event"] = f"error: {type(e).__name__}: {e}"
    result["default_collate_pin_memory"] = rate(plain_loader)
    result["slabs_copied_by_pin_thread"] = rate(lambda: slabs(False))
    result["slabs_pinned"] = rate(lambda: slabs(True))

    # DeviceFeeder copies on a side stream and drops each batch there: its batches over pinned
    # slabs (freed once that stream's copy is done) equal its batches over the plain loader.
    from lerobot_shards.loader import DeviceFeeder

    fed_mismatched, fed = [], 0
    for i, (a, b) in enumerate(zip(DeviceFeeder(plain_loader(), device), DeviceFeeder(slabs(True), device))):
        fed += 1
        for key, value in a.items():
            if isinstance(value, torch.Tensor) and not torch.equal(b[key], value):
                fed_mismatched.append(f"batch {i} {key}")
    result["feeder_over_pinned_slabs_equal"] = not fed_mismatched and fed == batches
    result["feeder_mismatches"] = fed_mismatched[:10]

    def fed_rate(make: Callable[[], DataLoader]) -> dict[str, Any]:
        def it(e: int) -> Iterator[Any]:
            loader = make()
            loader.dataset.set_epoch(e)
            for b in DeviceFeeder(loader, device, prefetch=4):
                if cuda:
                    torch.cuda.current_stream().synchronize()
                yield b

        return _timed_cpu(it, seconds, count, n_workers)

    # the feeder pins an unpinned batch itself, so these loaders leave pin_memory off
    result["feeder_over_slabs"] = fed_rate(
        lambda: DataLoader(ds(), batch_size=16, num_workers=n_workers, collate_fn=SlabCollate(6), prefetch_factor=4)
    )
    result["feeder_over_pinned_slabs"] = fed_rate(lambda: slabs(True))
    return result


def section_fallback(raw: Path) -> dict[str, Any]:
    from lerobot_shards.synth import read_identity

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(_dataset(raw, video_decode_device="cuda", episodes_per_shard=1))
        samples = [next(it) for _ in range(8)]
    messages = [str(w.message) for w in caught if "cannot decode" in str(w.message)]
    right = sum(read_identity(s[CAM][-1]) == (int(s["episode_index"]), int(s["frame_index"])) for s in samples)
    result: dict[str, Any] = {
        "fallback_warnings": len(messages),
        "warning": messages[0] if messages else None,
        "identity_ok": f"{right}/{len(samples)}",
    }
    try:
        next(iter(_dataset(raw, video_decode_device="cuda", episodes_per_shard=1, strict_cuda_decode=True)))
        result["strict"] = "no error (this GPU decodes AV1 on NVDEC)"
    except RuntimeError as e:
        result["strict"] = f"RuntimeError: {e}"
    return result


def section_train(conv: Path, work: Path, decode: str, workers: int, timeout_s: float) -> dict[str, Any]:
    """examples/train.py end to end on this GPU (one process): it runs, and what it reports."""
    example = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    cmd = [sys.executable, str(example), str(conv), "--ckpt", str(work / f"ckpt-{decode}.pt"), "--max-steps", "40"]
    cmd += ["--ckpt-every", "20", "--log-every", "20", "--workers", str(workers), "--decode-device", decode]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"train.py exit {done.returncode}: {done.stderr[-1500:]}")
    lines = done.stdout.splitlines()
    return {
        "workers": workers,
        "decode": decode,
        "done": next((x for x in lines if x.startswith("done:")), None),
        "sha": next((x.split()[1][:16] for x in lines if x.startswith("final-params-sha256")), None),
    }


def table(report: dict[str, Any]) -> str:
    rows = [("section", "status", "s", "figures")]
    for name, entry in report["sections"].items():
        figures = entry.get("error") or entry.get("why") or ""
        result = entry.get("result")
        if isinstance(result, dict):
            keep = {
                k: v for k, v in result.items() if not isinstance(v, (dict, list)) and k not in ("raw", "converted")
            }
            figures = ", ".join(f"{k}={v}" for k, v in keep.items())
        rows.append((name, entry["status"], str(entry.get("seconds", "")), figures[:160]))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/gpu_results")
    p.add_argument("--budget", type=float, default=270.0, help="seconds for all sections together")
    p.add_argument("--quick", action="store_true", help="tiny dataset and 1 s measurements (smoke test)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.budget, args.quick)
    seconds = 1.0 if args.quick else 6.0
    cpus = os.cpu_count() or 2
    cpu_workers = 2 if args.quick else max(1, min(12, cpus - 2))
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        env = check.run("env", section_env, need_s=0)
        if not cuda:
            print("no CUDA: running the CPU parts only", flush=True)
            check.report["no_cuda"] = True
        data = check.run("data", lambda: section_data(Path(tmp), args.quick), need_s=20)
        if data is None:
            print(table(check.report))
            return
        raw, conv = Path(data["raw"]), Path(data["converted"])
        missing = cuda_decode_missing(conv) if cuda else "no CUDA"
        cuda_decode = missing is None
        check.report["cuda_decode"] = "available" if cuda_decode else f"unavailable: {missing}"
        print(f"CUDA decoding: {check.report['cuda_decode']}", flush=True)
        backends = ("nvdec", "ffmpeg")
        if cuda_decode:
            for b in backends:
                check.run(f"identity/{b}", lambda b=b: section_identity(conv, b, args.quick), need_s=10)
        # Most telling first: a section that does not fit in the time left is skipped, not cut.
        check.run("slab", lambda: section_slab(conv, seconds), need_s=6 * seconds + 30)
        check.run(f"decode/cpu-{cpu_workers}w", lambda: section_decode(conv, "cpu", "nvdec", seconds, cpu_workers))
        if cuda_decode:
            for b in backends:
                check.run(f"decode/cuda-{b}-0w", lambda b=b: section_decode(conv, "cuda", b, seconds, 0))
        check.run("feeder", lambda: section_feeder(conv, seconds, cpu_workers, cuda_decode), need_s=3 * seconds + 10)
        if cuda_decode:
            for b in backends:
                check.run(f"vram/{b}", lambda b=b: section_vram(conv, b, args.quick), need_s=25)
            if data["raw_codec"] == "av1":
                check.run("av1_fallback", lambda: section_fallback(raw), need_s=10)
        if cuda:
            decodes = [("cpu", cpu_workers)] + ([("cuda", 0)] if cuda_decode else [])
            for decode, workers in decodes:
                check.run(
                    f"train/{decode}-decode",
                    lambda d=decode, w=workers: section_train(conv, Path(tmp), d, w, max(10.0, check.left() - 5)),
                    need_s=30,
                )
        check.run("decode/cpu-0w", lambda: section_decode(conv, "cpu", "nvdec", seconds, 0))
        if cuda_decode:
            check.run("decode/cuda-nvdec-2w", lambda: section_decode(conv, "cuda", "nvdec", seconds, 2), need_s=30)
        check.report["env_summary"] = env
    print(table(check.report))
    print(f"results: {out / 'gpu_check.json'}")


if __name__ == "__main__":
    main()
