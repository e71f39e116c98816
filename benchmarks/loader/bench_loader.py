#!/usr/bin/env python
"""Loader benchmark: EpisodePoolDataset on converted shards vs the raw LeRobot source vs pure
torchcodec decoding vs LeRobot's own LeRobotDataset, on the same dataset, window and workers.

For every window preset and DataLoader worker count it measures:

1. loader throughput (samples/s, frames decoded/s, time to first batch) of EpisodePoolDataset
   over the converted shards (converted into a temp dir with few episodes per shard, so every
   worker gets shards) and over the raw LeRobot v3.0 folder (same virtual shard plan and seed, so
   the same samples: checked);
2. RSS of the main process and of every DataLoader worker over the epoch (start/warm/mid/end/
   peak and growth; reported, never asserted);
3. the pure-decode limit: exactly the (episode, frame-window, camera) frames the loader emitted,
   decoded by torchcodec alone from the same clip bytes (sidecar offsets, custom_frame_mappings,
   one get_frames_at per sample and camera) in as many processes as the loader had workers;
   reported as frames/s and the loader's ratio to it (target >= 0.8x);
4. the LeRobot baseline: lerobot 0.4.4's map-style LeRobotDataset with a plain shuffled
   DataLoader, run by a separate venv's python (lerobot_baseline.py), never imported here;
   our samples/s as a ratio to it (target >= 2x), plus a key/dtype/shape/value comparison of
   LeRobot's sample 0 with ours;
5. the DataLoader ceiling: samples shaped exactly like ours (same keys, dtypes, shapes) made
   without any I/O or decoding, through the same DataLoader: the most any DataLoader-based loader
   can deliver on this machine (float32 640x480 images make collation and worker-to-main
   transfer the bottleneck, not decoding);
6. optionally the converted loader with CUDA decoding (skipped without CUDA).

Writes ``<out>/<tag>.json``, ``<out>/<tag>.csv`` and ``<out>/<tag>.md`` (tag: ``latest`` or
``quick``). Speed and memory live here, never in the tests.

    .venv/bin/python benchmarks/loader/bench_loader.py --quick
    .venv/bin/python benchmarks/loader/bench_loader.py                      # real fixture
    .venv/bin/python benchmarks/loader/bench_loader.py --synth --synth-episodes 32 --pool-size 4 --tag synth
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from memwatch import RssMonitor  # noqa: E402
from sample_shape import describe  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

DEFAULT_DATASET = "/work/shared/fixtures/so101_record_test"
STATE, ACTION = "observation.state", "action"
PURE_TARGET, LEROBOT_TARGET = 0.8, 2.0


# ------------------------------------------------------------------------------------ windows


def window_preset(name: str, fps: float, cameras: list[str], features: dict[str, Any]) -> dict[str, list[float]] | None:
    """delta_timestamps of a preset, on the dataset's frame grid (keys the dataset lacks are left out)."""
    dt = 1.0 / fps
    if name == "frame":  # one frame per camera, no windows
        return None
    if name == "act":  # ACT / pi0-like: current images, a chunk of 50 future actions
        d = {ACTION: [i * dt for i in range(50)]}
    elif name == "diffusion":  # Diffusion Policy: 2 observation steps, horizon 16
        d = {cam: [-dt, 0.0] for cam in cameras}
        d[STATE] = [-dt, 0.0]
        d[ACTION] = [(i - 1) * dt for i in range(16)]
    elif name == "video4":  # 4 frames per camera, 3 frames apart (temporal stack)
        d = {cam: [-9 * dt, -6 * dt, -3 * dt, 0.0] for cam in cameras}
        d[STATE] = [-9 * dt, -6 * dt, -3 * dt, 0.0]
    else:
        raise SystemExit(f"unknown window preset {name!r}; choose from {', '.join(WINDOWS)}")
    return {k: v for k, v in d.items() if k in features}


WINDOWS = ("frame", "act", "diffusion", "video4")


def camera_offsets(delta: dict[str, list[float]] | None, cameras: list[str], fps: float) -> dict[str, list[int]]:
    return {cam: [int(round(d * fps)) for d in (delta or {}).get(cam, [0.0])] for cam in cameras}


# ------------------------------------------------------------------------------------ helpers


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def rnd(x: float | None, n: int = 2) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), n)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def default_lerobot_python() -> str | None:
    for p in (REPO / ".venv-lerobot/bin/python", Path("/work/lerobot-venv/bin/python")):
        if p.exists():
            return str(p)
    return None


def git_state() -> dict[str, Any]:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "src"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return {"commit": head or None, "src_dirty": bool(dirty)}
    except Exception:  # noqa: BLE001
        return {"commit": None}


# ------------------------------------------------------------------------------------ our loader


def run_loader(
    source: str,
    *,
    delta: dict[str, list[float]] | None,
    workers: int,
    batch_size: int,
    seed: int,
    pool_size: int,
    image_dtype: torch.dtype,
    max_samples: int,
    episodes_per_shard: int | None,
    device: str = "cpu",
    ffmpeg_threads: int | None = None,
) -> dict[str, Any]:
    """One epoch (or max_samples) of EpisodePoolDataset through a DataLoader, with RSS sampling."""
    from lerobot_shards.loader import EpisodePoolDataset

    t = time.perf_counter()
    kwargs: dict[str, Any] = dict(
        delta_timestamps=delta,
        episode_pool_size=pool_size,
        seed=seed,
        image_dtype=image_dtype,
        video_decode_device=device,
    )
    if ffmpeg_threads is not None:
        kwargs["num_ffmpeg_threads"] = ffmpeg_threads
    if episodes_per_shard is not None:
        kwargs["episodes_per_shard"] = episodes_per_shard
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = EpisodePoolDataset(source, **kwargs)
        init_s = time.perf_counter() - t
        dl_kwargs: dict[str, Any] = {}
        if workers and device != "cpu":
            dl_kwargs["multiprocessing_context"] = "spawn"  # CUDA cannot start in forked workers
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, **dl_kwargs)
        epoch_samples = ds.epoch_samples(workers)
        mon = RssMonitor().start()
        t0 = time.perf_counter()
        it = iter(loader)
        n = batches = 0
        first = None
        emitted: list[tuple[int, int]] = []
        for batch in it:
            if first is None:
                first = time.perf_counter() - t0
                mon.first_batch()
            emitted += zip(batch["episode_index"].reshape(-1).tolist(), batch["frame_index"].reshape(-1).tolist())
            n += len(batch["index"])
            batches += 1
            if max_samples and n >= max_samples:
                break
        wall = time.perf_counter() - t0
        mon.end_of_epoch()
        stats = ds.stats()
        del it
        memory = mon.stop()
    total = stats["total"]
    per_sample = sum(len(v) for v in camera_offsets(delta, list(ds.cameras), ds.fps).values())
    delivered = n * per_sample  # camera frames in the samples that reached the loop
    steady = (n - batch_size) / (wall - first) if first is not None and n > batch_size and wall > first else None
    return {
        "loadavg_1m": rnd(os.getloadavg()[0]),
        "init_s": rnd(init_s, 3),
        "epoch_samples": epoch_samples,
        "samples": n,
        "batches": batches,
        "wall_s": rnd(wall, 3),
        "first_batch_s": rnd(first, 3),
        "samples_per_s": rnd(n / wall),
        "steady_samples_per_s": rnd(steady),
        "frames_delivered": delivered,
        "frames_per_s": rnd(delivered / wall),
        "frames_decoded": int(total["frames_decoded"]),  # counter: includes batches prefetched past max_samples
        "decode_seconds": rnd(total["decode_seconds"], 3),
        "wait_seconds": rnd(total["wait_seconds"], 3),
        "bytes_read": int(total["bytes_read"]),
        "decoder_misses": int(total["decoder_misses"]),
        "decoder_evictions": int(total["decoder_evictions"]),
        "per_worker_stats": [
            {k: (rnd(v, 3) if isinstance(v, float) else v) for k, v in w.items()} for w in stats["workers"]
        ],
        "memory": memory,
        "warnings": sorted({str(w.message) for w in caught}),
        "emitted": emitted,  # (episode, frame) in arrival order; dropped from the JSON report
    }


def our_sample0(source: str, delta: dict[str, list[float]] | None, image_dtype: torch.dtype) -> dict[str, Any]:
    """Our sample for (episode 0, frame 0): an unshuffled stream over episode 0 starts there."""
    from lerobot_shards.loader import EpisodePoolDataset

    ds = EpisodePoolDataset(
        source, delta_timestamps=delta, episode_pool_size=1, shuffle=False, episodes=[0], image_dtype=image_dtype
    )
    it = iter(ds)
    sample = next(it)
    del it
    return sample


# ------------------------------------------------------------------------------------ DataLoader ceiling


class TemplateDataset(torch.utils.data.IterableDataset):
    """Samples shaped exactly like ours, made without I/O or decoding: what the DataLoader alone allows.

    Float images are kept as uint8 and converted per sample as the loader does (``float().div_(255)``),
    every other tensor is cloned; workers split the samples round-robin.
    """

    def __init__(self, template: dict[str, Any], num_samples: int) -> None:
        super().__init__()
        self.num_samples = num_samples
        self.template = {}
        for k, v in template.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 3:
                self.template[k] = ("image", (v * 255).round().to(torch.uint8))
            elif isinstance(v, torch.Tensor):
                self.template[k] = ("tensor", v)
            else:
                self.template[k] = ("value", v)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for _ in range(worker, self.num_samples, workers):
            item = {}
            for k, (kind, v) in self.template.items():
                item[k] = v.float().div_(255) if kind == "image" else v.clone() if kind == "tensor" else v
            yield item


def run_ceiling(template: dict[str, Any], num_samples: int, workers: int, batch_size: int) -> dict[str, Any]:
    loader = DataLoader(TemplateDataset(template, num_samples), batch_size=batch_size, num_workers=workers)
    t0 = time.perf_counter()
    n, first = 0, None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(batch["index"])
    wall = time.perf_counter() - t0
    steady = (n - batch_size) / (wall - first) if first is not None and n > batch_size and wall > first else None
    return {
        "samples": n,
        "wall_s": rnd(wall, 3),
        "first_batch_s": rnd(first, 3),
        "samples_per_s": rnd(n / wall),
        "steady_samples_per_s": rnd(steady),
    }


# ------------------------------------------------------------------------------------ pure decode


def _episode_clips(root: str, episodes: set[int], cameras: list[str]) -> dict[tuple[int, str], tuple[bytes, str, int]]:
    """(episode, camera) -> (clip bytes, custom_frame_mappings JSON, length), cut from the shards by sidecar offsets."""
    from lerobot_shards import format as fmt

    manifest = fmt.Manifest.from_json(Path(root, fmt.MANIFEST_NAME).read_text())
    out = {}
    for rec in manifest.shards:
        if not episodes.intersection(rec.episodes):
            continue
        shards = Path(root, fmt.SHARDS_DIR)
        sidecar = fmt.Sidecar.from_json((shards / rec.sidecar).read_text())
        with open(shards / rec.name, "rb") as f:
            for entry in sidecar.episodes:
                if entry.episode_index not in episodes:
                    continue
                for cam in cameras:
                    m = entry.members[fmt.clip_member(entry.key, cam)]
                    f.seek(m.offset)
                    data = f.read(m.size)
                    out[(entry.episode_index, cam)] = (data, entry.clips[cam].frame_mappings_json(), entry.length)
    return out


def _pure_decode_proc(root, items, cameras, offsets, threads, cache_cap, barrier, results) -> None:
    from torchcodec.decoders import VideoDecoder

    try:
        clips = _episode_clips(root, {e for e, _ in items}, cameras)
        decoders: OrderedDict = OrderedDict()
        frames = builds = 0
        barrier.wait()
        t0 = time.perf_counter()
        for e, f in items:
            for cam in cameras:
                data, mappings, length = clips[(e, cam)]
                dec = decoders.get((e, cam))
                if dec is None:
                    dec = VideoDecoder(data, custom_frame_mappings=mappings, num_ffmpeg_threads=threads)
                    decoders[(e, cam)] = dec
                    builds += 1
                    while len(decoders) > cache_cap:
                        decoders.popitem(last=False)
                else:
                    decoders.move_to_end((e, cam))
                idx = [min(max(f + o, 0), length - 1) for o in offsets[cam]]
                frames += dec.get_frames_at(idx).data.shape[0]
        t1 = time.perf_counter()
        results.put({"t0": t0, "t1": t1, "frames": frames, "samples": len(items), "decoder_builds": builds})
    except BaseException as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"error": f"{type(e).__name__}: {e}"})


def split_by_episode(emitted: list[tuple[int, int]], parts: int) -> list[list[tuple[int, int]]]:
    """Whole episodes per process, balanced by sample count; each keeps the loader's emission order."""
    counts: dict[int, int] = {}
    for e, _ in emitted:
        counts[e] = counts.get(e, 0) + 1
    load = [0] * parts
    owner: dict[int, int] = {}
    for e in sorted(counts, key=lambda e: -counts[e]):
        p = load.index(min(load))
        owner[e] = p
        load[p] += counts[e]
    out: list[list[tuple[int, int]]] = [[] for _ in range(parts)]
    for e, f in emitted:
        out[owner[e]].append((e, f))
    return [x for x in out if x]


def best_of(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the highest ``key`` (other processes on a shared machine only ever slow a run down),
    with every repeat's figure kept under ``<key>_all``."""
    ok = [r for r in runs if r.get(key)]
    best = dict(max(ok, key=lambda r: r[key]) if ok else runs[0])
    if len(runs) > 1:
        best[f"{key}_all"] = [r.get(key) for r in runs]
    return best


def loader_ffmpeg_threads(workers: int) -> int:
    """The num_ffmpeg_threads EpisodePoolDataset uses by default (so pure decode decodes alike)."""
    import inspect

    from lerobot_shards.loader import EpisodePoolDataset

    default = inspect.signature(EpisodePoolDataset.__init__).parameters["num_ffmpeg_threads"].default
    if isinstance(default, int):
        return default
    return 1 if workers else 0  # older loaders: 1 per worker, auto (0) without workers


def run_pure_decode(
    root: str,
    emitted: list[tuple[int, int]],
    cameras: list[str],
    offsets: dict[str, list[int]],
    workers: int,
    pool_size: int,
    ffmpeg_threads: int | None = None,
) -> dict[str, Any]:
    procs_n = max(1, workers)
    parts = split_by_episode(emitted, procs_n)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(parts))
    results = ctx.Queue()
    threads = ffmpeg_threads if ffmpeg_threads is not None else loader_ffmpeg_threads(workers)
    cache_cap = min(64, pool_size * max(1, len(cameras)))
    procs = [
        ctx.Process(
            target=_pure_decode_proc,
            args=(root, part, cameras, offsets, threads, cache_cap, barrier, results),
            daemon=True,
        )
        for part in parts
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [g["error"] for g in got if "error" in g]
    if errors:
        return {"error": "; ".join(errors)}
    span = max(g["t1"] for g in got) - min(g["t0"] for g in got)
    frames = sum(g["frames"] for g in got)
    samples = sum(g["samples"] for g in got)
    return {
        "processes": len(parts),
        "samples": samples,
        "frames": frames,
        "wall_s": rnd(span, 3),
        "frames_per_s": rnd(frames / span),
        "samples_per_s": rnd(samples / span),
        "per_process_frames_per_s": [rnd(g["frames"] / (g["t1"] - g["t0"])) for g in got],
        "decoder_builds": sum(g["decoder_builds"] for g in got),
    }


# ------------------------------------------------------------------------------------ LeRobot


def run_lerobot(
    python: str,
    root: str,
    delta: dict | None,
    workers: list[int],
    batch_size: int,
    seed: int,
    max_samples: int,
    sample0_out: str,
    hf_home: str,
    timeout: int,
    repeat: int = 1,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=hf_home, TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    cmd = [
        python,
        str(HERE / "lerobot_baseline.py"),
        "--root",
        root,
        "--delta-timestamps",
        json.dumps(delta),
        "--workers",
        ",".join(map(str, workers)),
        "--batch-size",
        str(batch_size),
        "--seed",
        str(seed),
        "--max-samples",
        str(max_samples),
        "--sample0-out",
        sample0_out,
        "--repeat",
        str(repeat),
    ]
    if torch_threads:
        cmd += ["--torch-threads", str(torch_threads)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"exit {proc.returncode}, no JSON; stderr: {proc.stderr[-2000:]}"}
    result = json.loads(lines[-1])
    result["subprocess_s"] = rnd(time.perf_counter() - t, 2)
    if not result.get("ok"):
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


def compare_samples(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Keys, types, dtypes, shapes and values of our sample vs LeRobot's (same episode 0, frame 0)."""
    diffs: list[str] = []
    rows = []
    for k in sorted(set(ours) | set(theirs)):
        a, b = ours.get(k), theirs.get(k)
        row: dict[str, Any] = {"key": k}
        if a is None or b is None:
            row["status"] = "only in ours" if b is None else "only in LeRobot"
            diffs.append(f"{k}: {row['status']}")
            rows.append(row)
            continue
        da, db = describe({k: a})[k], describe({k: b})[k]
        row.update(ours=da, lerobot=db)
        if da != db:
            row["status"] = "DIFF type/dtype/shape"
            diffs.append(f"{k}: ours {da} vs LeRobot {db}")
        elif isinstance(a, torch.Tensor):
            if a.is_floating_point():
                err = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
                row["max_abs_diff"] = err
                limit = 1.0 / 255 + 1e-6 if a.dim() >= 3 else 1e-6
                row["status"] = "ok" if err <= limit else "DIFF values"
            else:
                row["status"] = "ok" if torch.equal(a, b) else "DIFF values"
            if row["status"] != "ok":
                diffs.append(f"{k}: values differ ({row.get('max_abs_diff', 'not equal')})")
        else:
            row["status"] = "ok" if a == b else "DIFF values"
            if a != b:
                diffs.append(f"{k}: {a!r} vs {b!r}")
        rows.append(row)
    return {"identical_keys": set(ours) == set(theirs), "differences": diffs, "keys": rows}


# ------------------------------------------------------------------------------------ reporting


MEM_FIELDS = (
    "start_mb",
    "warm_mb",
    "mid_mb",
    "end_mb",
    "peak_mb",
    "growth_mb",
    "growth_2nd_half_mb",
    "floor_growth_mb",
    "slope_mb_per_min",
)


def worker_memory_rows(memory: dict[str, Any]) -> list[dict[str, Any]]:
    if not memory.get("available"):
        return []
    rows = []
    if memory.get("main"):
        rows.append({"proc": "main", **{k: memory["main"][k] for k in MEM_FIELDS}})
    for w in memory.get("workers", []):
        rows.append({"proc": f"worker {w['worker']}", **{k: w[k] for k in MEM_FIELDS}})
    return rows


def max_worker_growth(memory: dict[str, Any] | None) -> float | None:
    if not memory or not memory.get("available"):
        return None
    ws = memory.get("workers") or ([memory["main"]] if memory.get("main") else [])
    return max((w["growth_mb"] for w in ws), default=None)


def peak_worker_mb(memory: dict[str, Any] | None) -> float | None:
    if not memory or not memory.get("available"):
        return None
    ws = memory.get("workers") or ([memory["main"]] if memory.get("main") else [])
    return max((w["peak_mb"] for w in ws), default=None)


CSV_FIELDS = (
    "window",
    "workers",
    "kind",
    "samples",
    "frames",
    "wall_s",
    "first_batch_s",
    "samples_per_s",
    "steady_samples_per_s",
    "frames_per_s",
    "ratio_to_pure_decode",
    "ratio_to_lerobot",
    "ratio_to_ceiling",
    "worker_peak_rss_mb",
    "worker_max_growth_mb",
    "note",
)


def flat_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for w in report["windows"]:
        for c in w["cases"]:
            for kind in ("converted", "raw", "pure_decode", "dataloader_ceiling", "lerobot", "converted_cuda"):
                r = c.get(kind)
                if not r:
                    continue
                if r.get("skipped") or r.get("error"):
                    rows.append(
                        {
                            "window": w["window"],
                            "workers": c["workers"],
                            "kind": kind,
                            "note": r.get("skipped") or r.get("error"),
                        }
                    )
                    continue
                rows.append(
                    {
                        "window": w["window"],
                        "workers": c["workers"],
                        "kind": kind,
                        "samples": r.get("samples"),
                        "frames": r.get("frames_delivered", r.get("frames")),
                        "wall_s": r.get("wall_s"),
                        "first_batch_s": r.get("first_batch_s"),
                        "samples_per_s": r.get("samples_per_s"),
                        "steady_samples_per_s": r.get("steady_samples_per_s"),
                        "frames_per_s": r.get("frames_per_s"),
                        "ratio_to_pure_decode": r.get("ratio_to_pure_decode"),
                        "ratio_to_lerobot": r.get("ratio_to_lerobot"),
                        "ratio_to_ceiling": r.get("ratio_to_ceiling"),
                        "worker_peak_rss_mb": peak_worker_mb(r.get("memory")),
                        "worker_max_growth_mb": max_worker_growth(r.get("memory")),
                        "note": r.get("note", ""),
                    }
                )
    return rows


def bar_chart(rows: list[dict[str, Any]], width: int = 44) -> str:
    data = [
        (f"{r['window']:<9} w={r['workers']} {r['kind']:<18}", r["samples_per_s"])
        for r in rows
        if r.get("samples_per_s")
    ]
    if not data:
        return "(no data)"
    top = max(v for _, v in data)
    lines = []
    for label, v in data:
        n = max(1, round(width * v / top))
        lines.append(f"{label} |{'#' * n}{' ' * (width - n)}| {v:8.1f}")
    return "\n".join(lines)


def fmt(v: Any, suffix: str = "") -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}{suffix}" if abs(v) < 100 else f"{v:.1f}{suffix}"
    return f"{v}{suffix}"


def markdown(report: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    env, cfg = report["environment"], report["config"]
    out = [f"# Loader benchmark — {report['tag']} ({report['finished']})", ""]
    out.append(
        f"Dataset: `{cfg['dataset']}` ({cfg['dataset_summary']}); converted with "
        f"{cfg['episodes_per_shard']} episode(s)/shard into {report['conversion']['shards']} shards "
        f"in {report['conversion']['seconds']} s. Batch size {cfg['batch_size']}, pool size "
        f"{cfg['pool_size']}, image dtype {cfg['image_dtype']}, seed {cfg['seed']}, main-process torch "
        f"threads {cfg.get('torch_threads')}, ffmpeg threads "
        f"{cfg['ffmpeg_threads']}, "
        f"{'max ' + str(cfg['max_samples']) + ' samples per run' if cfg['max_samples'] else 'one full epoch per run'}"
        f"{', fastest of ' + str(cfg['repeat']) + ' repeats' if cfg.get('repeat', 1) > 1 else ''}."
    )
    out.append(
        f"Machine: {env['cpus']} CPUs (load average at start {env['loadavg_start']}, end "
        f"{env.get('loadavg_end')}), torch {env['torch']}, torchcodec {env['torchcodec']}, "
        f"commit {env['git'].get('commit')}{' + uncommitted src changes' if env['git'].get('src_dirty') else ''}."
    )
    lr = report.get("lerobot", {})
    out.append(f"LeRobot baseline: {lr.get('status')}.")
    out += [
        "",
        "## Throughput",
        "",
        "| window | workers | kind | samples/s | steady samples/s | frames/s | first batch s | "
        "vs pure decode | vs LeRobot | vs DataLoader ceiling | worker peak RSS MiB | worker RSS growth MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("note") and not r.get("samples_per_s"):
            out.append(f"| {r['window']} | {r['workers']} | {r['kind']} | {r['note']} | | | | | | | | |")
            continue
        out.append(
            f"| {r['window']} | {r['workers']} | {r['kind']} | {fmt(r['samples_per_s'])} | "
            f"{fmt(r['steady_samples_per_s'])} | {fmt(r['frames_per_s'])} | {fmt(r['first_batch_s'])} | "
            f"{fmt(r['ratio_to_pure_decode'], 'x')} | {fmt(r['ratio_to_lerobot'], 'x')} | "
            f"{fmt(r.get('ratio_to_ceiling'), 'x')} | "
            f"{fmt(r['worker_peak_rss_mb'])} | {fmt(r['worker_max_growth_mb'])} |"
        )
    out += [
        "",
        "Targets (reported, not asserted): converted loader frames/s >= "
        f"{PURE_TARGET}x pure decode; converted loader samples/s >= {LEROBOT_TARGET}x LeRobot.",
        "Pure decode samples/s counts decode only (no parquet, float conversion or collation). "
        "The DataLoader ceiling pushes samples shaped exactly like ours (same keys, dtypes, shapes; float "
        "images converted from uint8 per sample as the loader does) through the same DataLoader without "
        "any I/O or decoding: no DataLoader-based loader can beat it on this machine.",
        "",
        "## Samples/s",
        "",
        "```",
        bar_chart(rows),
        "```",
        "",
    ]
    out += [
        "## Memory per process over the epoch (RSS, MiB)",
        "",
        "growth = end − warm (warm: when the first batch arrived); floor growth = min of the last quarter − "
        "min of the second quarter (decoded batches come and go above a floor, a leak lifts the floor); "
        "slope: least squares after the first batch. All must stay near 0; a 4-episode dataset keeps every "
        "episode resident, so only `--synth` with many episodes exercises the pool's admit/evict cycle.",
        "",
    ]
    for w in report["windows"]:
        for c in w["cases"]:
            for kind in ("converted", "raw", "lerobot"):
                r = c.get(kind) or {}
                mrows = worker_memory_rows(r.get("memory") or {})
                if not mrows:
                    continue
                out.append(f"**{w['window']}, workers={c['workers']}, {kind}**")
                out.append("")
                out.append(
                    "| process | start | warm | mid | end | peak | growth | growth 2nd half | floor growth "
                    "| slope MiB/min |"
                )
                out.append("|---|---|---|---|---|---|---|---|---|---|")
                for m in mrows:
                    out.append(f"| {m['proc']} | " + " | ".join(fmt(m[k]) for k in MEM_FIELDS) + " |")
                out.append("")
    cfg = report["config"]
    out += ["## Checks", ""]
    for w in report["windows"]:
        for c in w["cases"]:
            same = c.get("same_samples_raw_vs_converted")
            raw_text = (
                "" if same is None else (f"raw source emitted the same samples as the converted shards: **{same}**; ")
            )
            out.append(
                f"- {w['window']}, workers={c['workers']}: {raw_text}pure decode decoded "
                f"{(c.get('pure_decode') or {}).get('frames')} frames, the loader "
                f"{(c.get('converted') or {}).get('frames_delivered')} (its decoder counter: "
                f"{(c.get('converted') or {}).get('frames_decoded')}"
                f"{', which includes batches prefetched past --max-samples' if cfg['max_samples'] else ''})."
            )
            if cfg.get("repeat", 1) > 1:
                out.append(
                    f"  - every repeat emitted the same samples: {c.get('same_samples_across_repeats')}; "
                    f"samples/s of the repeats: converted {(c.get('converted') or {}).get('samples_per_s_all')}, "
                    f"raw {(c.get('raw') or {}).get('samples_per_s_all')}, LeRobot "
                    f"{(c.get('lerobot') or {}).get('samples_per_s_all')}"
                )
            for kind in ("converted", "raw"):
                for msg in (c.get(kind) or {}).get("warnings", []):
                    out.append(f"  - {kind} loader warning: {msg}")
        compat = w.get("compat")
        if compat:
            if compat.get("error"):
                out.append(f"- {w['window']}: sample-0 comparison not done: {compat['error']}")
            else:
                verdict = (
                    "identical keys, dtypes, shapes and values"
                    if not compat["differences"]
                    else "DIFFERENCES: " + "; ".join(compat["differences"])
                )
                out.append(f"- {w['window']}: LeRobot sample 0 vs ours (episode 0, frame 0): {verdict}")
    out.append("")
    if report.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in report["notes"]] + [""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="smoke run (< 1 min): workers 0,2, window 'frame', 96 samples per run"
    )
    ap.add_argument("--dataset", default=DEFAULT_DATASET, help="raw LeRobot v3.0 dataset (default: the real fixture)")
    ap.add_argument("--synth", action="store_true", help="generate a synthetic dataset instead of --dataset")
    ap.add_argument("--synth-episodes", type=int, default=24)
    ap.add_argument("--synth-cameras", type=int, default=2)
    ap.add_argument("--synth-size", default="240x320", help="HxW")
    ap.add_argument("--synth-codec", default="h264", choices=("h264", "hevc", "av1"))
    ap.add_argument("--synth-gop", type=int, default=2)
    ap.add_argument("--synth-fps", type=int, default=30)
    ap.add_argument("--synth-length", default="150,300", help="min,max frames per episode")
    ap.add_argument("--workers", default="0,1,2", help="comma-separated DataLoader worker counts")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--window", default="act", help=f"comma-separated presets: {', '.join(WINDOWS)}")
    ap.add_argument("--pool-size", type=int, default=8, help="episode_pool_size of EpisodePoolDataset")
    ap.add_argument(
        "--episodes-per-shard", type=int, default=None, help="default: so that every worker gets at least 2 shards"
    )
    ap.add_argument("--image-dtype", default="float32", choices=("float32", "uint8"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads in the main process, ours and LeRobot's (matters for workers=0; "
        "DataLoader workers always use 1); default: torch's default",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement N times and keep the fastest (the machine is shared)",
    )
    ap.add_argument(
        "--ffmpeg-threads",
        type=int,
        default=None,
        help="num_ffmpeg_threads for our loader and pure decode (default: the loader's default)",
    )
    ap.add_argument("--max-samples", type=int, default=0, help="stop each run after N samples (0: full epoch)")
    ap.add_argument(
        "--lerobot-python",
        default=default_lerobot_python(),
        help="python of the LeRobot 0.4.4 venv (default ./.venv-lerobot or /work/lerobot-venv)",
    )
    ap.add_argument("--no-lerobot", action="store_true", help="skip the LeRobot baseline")
    ap.add_argument("--no-raw", action="store_true", help="skip the raw-source loader runs")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the DataLoader-ceiling runs")
    ap.add_argument("--cuda", choices=("auto", "on", "off"), default="auto", help="CUDA decode column")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default=None, help="result file name stem (default: latest, or quick with --quick)")
    ap.add_argument(
        "--render",
        default=None,
        metavar="JSON",
        help="measure nothing: rewrite the .md and .csv next to a result .json",
    )
    ap.add_argument("--work-dir", default=None, help="where the converted copy goes (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers = "0,2" if args.workers == ap.get_default("workers") else args.workers
        args.window = "frame" if args.window == ap.get_default("window") else args.window
        args.max_samples = args.max_samples or 96
        args.synth_episodes = min(args.synth_episodes, 6)
        args.synth_length = "30,60" if args.synth_length == ap.get_default("synth_length") else args.synth_length
    args.tag = args.tag or ("quick" if args.quick else "latest")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        path = Path(args.render)
        write_report(json.loads(path.read_text()), path.parent, path.stem, echo=False)
        log(f"rewrote {path.with_suffix('.md')} and {path.with_suffix('.csv')}")
        return 0
    import torchcodec

    from lerobot_shards.convert.plan import ConvertOptions
    from lerobot_shards.convert.run import convert_dataset

    started = time.time()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    windows = [w.strip() for w in args.window.split(",") if w.strip()]
    image_dtype = torch.float32 if args.image_dtype == "float32" else torch.uint8
    own_work = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-loader-"))
    work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    report: dict[str, Any] = {"tag": args.tag, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "windows": []}
    report["environment"] = {
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchcodec": torchcodec.__version__,
        "torch_threads": torch.get_num_threads(),
        "git": git_state(),
    }
    try:
        # ---- dataset
        if args.synth:
            from lerobot_shards.synth import synth_dataset

            h, w = (int(x) for x in args.synth_size.lower().split("x"))
            lo, hi = (int(x) for x in args.synth_length.split(","))
            cams = [
                "observation.images.front",
                "observation.images.top",
                "observation.images.wrist",
                "observation.images.side",
            ][: args.synth_cameras]
            if args.synth_cameras > 4:
                cams += [f"observation.images.cam{i}" for i in range(4, args.synth_cameras)]
            dataset = work / "synth"
            if not (dataset / "meta/info.json").exists():
                log(f"synthesising {args.synth_episodes} episodes {h}x{w} {args.synth_codec} into {dataset}")
                t = time.perf_counter()
                synth_dataset(
                    dataset,
                    num_episodes=args.synth_episodes,
                    cameras=cams,
                    height=h,
                    width=w,
                    fps=args.synth_fps,
                    codec=args.synth_codec,
                    gop=args.synth_gop,
                    length_range=(lo, hi),
                    episodes_per_video_file=4,
                    episodes_per_data_file=8,
                    seed=args.seed,
                )
                notes.append(f"synthetic dataset made in {time.perf_counter() - t:.1f} s")
        else:
            dataset = Path(args.dataset)
        info = json.loads((dataset / "meta/info.json").read_text())
        fps = float(info["fps"])
        cameras = [k for k, v in info["features"].items() if v["dtype"] == "video"]
        n_episodes, n_frames = int(info["total_episodes"]), int(info["total_frames"])
        eps = args.episodes_per_shard or max(1, n_episodes // (2 * max(1, max(workers))))
        shape = info["features"][cameras[0]]["shape"] if cameras else None
        codec = info["features"][cameras[0]].get("info", {}).get("video.codec") if cameras else None
        summary = f"{n_episodes} episodes, {n_frames} frames, {len(cameras)} cameras {shape} {codec}, {fps:g} fps"
        report["config"] = {
            "dataset": str(dataset),
            "synthetic": args.synth,
            "dataset_summary": summary,
            "workers": workers,
            "windows": windows,
            "batch_size": args.batch_size,
            "pool_size": args.pool_size,
            "episodes_per_shard": eps,
            "image_dtype": args.image_dtype,
            "seed": args.seed,
            "max_samples": args.max_samples,
            "quick": args.quick,
            "repeat": args.repeat,
            "torch_threads": torch.get_num_threads(),
            "ffmpeg_threads": args.ffmpeg_threads
            if args.ffmpeg_threads is not None
            else f"loader default ({loader_ffmpeg_threads(1)} per worker, {loader_ffmpeg_threads(0)} without workers)",
        }
        log(f"dataset {dataset}: {summary}")

        # ---- conversion
        converted = work / "converted"
        t = time.perf_counter()
        if not (converted / "manifest.json").exists():
            manifest = convert_dataset(
                str(dataset), str(converted), ConvertOptions(episodes_per_shard=eps), workers=1, progress=False
            )
        else:
            from lerobot_shards.format import Manifest

            manifest = Manifest.from_json((converted / "manifest.json").read_text())
        report["conversion"] = {
            "seconds": rnd(time.perf_counter() - t, 2),
            "shards": len(manifest.shards),
            "bytes": manifest.total_bytes,
            "video": manifest.video,
        }
        log(f"converted into {len(manifest.shards)} shards in {report['conversion']['seconds']} s")

        # ---- LeRobot availability
        lerobot_python = None if args.no_lerobot else args.lerobot_python
        if args.no_lerobot:
            report["lerobot"] = {"status": "skipped (--no-lerobot)"}
        elif not lerobot_python or not Path(lerobot_python).exists():
            report["lerobot"] = {
                "status": "SKIPPED: no LeRobot venv found (run benchmarks/loader/"
                "setup_lerobot_venv.sh, or pass --lerobot-python)"
            }
            lerobot_python = None
        else:
            report["lerobot"] = {"status": f"lerobot via {lerobot_python}"}
        log(f"LeRobot baseline: {report['lerobot']['status']}")

        cuda = args.cuda == "on" or (args.cuda == "auto" and torch.cuda.is_available())
        if not cuda:
            notes.append(
                "CUDA decode column skipped: "
                + ("--cuda off" if args.cuda == "off" else "torch.cuda.is_available() is False on this machine")
            )

        # ---- warm-up (imports, page cache), not measured
        log("warm-up")
        run_loader(
            str(converted),
            delta=None,
            workers=0,
            batch_size=args.batch_size,
            seed=args.seed,
            pool_size=args.pool_size,
            image_dtype=image_dtype,
            max_samples=2 * args.batch_size,
            episodes_per_shard=None,
        )

        for window in windows:
            delta = window_preset(window, fps, cameras, info["features"])
            offsets = camera_offsets(delta, cameras, fps)
            wrep: dict[str, Any] = {"window": window, "delta_timestamps": delta, "cases": []}
            template = None if args.no_ceiling else our_sample0(str(converted), delta, image_dtype)
            for w in workers:
                case: dict[str, Any] = {"workers": w}
                common = dict(
                    delta=delta,
                    workers=w,
                    batch_size=args.batch_size,
                    seed=args.seed,
                    pool_size=args.pool_size,
                    image_dtype=image_dtype,
                    max_samples=args.max_samples,
                    ffmpeg_threads=args.ffmpeg_threads,
                )
                convs, raws, pures, ceils = [], [], [], []
                for r in range(args.repeat):
                    rep = f" (repeat {r + 1}/{args.repeat})" if args.repeat > 1 else ""
                    log(f"[{window} w={w}] converted shards{rep}")
                    convs.append(run_loader(str(converted), episodes_per_shard=None, **common))
                    log(
                        f"  {convs[-1]['samples']} samples, {convs[-1]['samples_per_s']} samples/s, "
                        f"first batch {convs[-1]['first_batch_s']} s"
                    )
                    if not args.no_raw:
                        log(f"[{window} w={w}] raw LeRobot source{rep}")
                        raws.append(run_loader(str(dataset), episodes_per_shard=eps, **common))
                        log(
                            f"  {raws[-1]['samples']} samples, {raws[-1]['samples_per_s']} samples/s, "
                            f"first batch {raws[-1]['first_batch_s']} s"
                        )
                    log(f"[{window} w={w}] pure decode ({max(1, w)} process(es)){rep}")
                    pures.append(
                        run_pure_decode(
                            str(converted),
                            convs[0]["emitted"],
                            cameras,
                            offsets,
                            w,
                            args.pool_size,
                            args.ffmpeg_threads,
                        )
                    )
                    log(
                        f"  {pures[-1].get('frames')} frames, {pures[-1].get('frames_per_s')} frames/s "
                        f"{pures[-1].get('error', '')}"
                    )
                    if not args.no_ceiling:
                        log(f"[{window} w={w}] DataLoader ceiling (same samples, no I/O, no decode){rep}")
                        ceils.append(run_ceiling(template, convs[0]["samples"], w, args.batch_size))
                        log(f"  {ceils[-1]['samples_per_s']} samples/s")
                case["same_samples_across_repeats"] = all(c["emitted"] == convs[0]["emitted"] for c in convs)
                conv, pure = best_of(convs, "samples_per_s"), best_of(pures, "frames_per_s")
                if not args.no_raw:
                    raw = best_of(raws, "samples_per_s")
                    case["same_samples_raw_vs_converted"] = raw["emitted"] == conv["emitted"]
                    case["same_sample_set_raw_vs_converted"] = sorted(raw["emitted"]) == sorted(conv["emitted"])
                    raw.pop("emitted")
                    case["raw"] = raw
                for r_ in convs + raws:
                    r_.pop("emitted", None)
                conv.pop("emitted", None)
                conv["ratio_to_pure_decode"] = ratio(conv["frames_per_s"], pure.get("frames_per_s"))
                if not args.no_raw:
                    case["raw"]["ratio_to_pure_decode"] = ratio(case["raw"]["frames_per_s"], pure.get("frames_per_s"))
                case["converted"], case["pure_decode"] = conv, pure
                if ceils:
                    ceil = best_of(ceils, "samples_per_s")
                    ceil["frames_per_s"] = rnd(ceil["samples_per_s"] * sum(len(v) for v in offsets.values()))
                    case["dataloader_ceiling"] = ceil
                    conv["ratio_to_ceiling"] = ratio(conv["samples_per_s"], ceil["samples_per_s"])
                    if "raw" in case:
                        case["raw"]["ratio_to_ceiling"] = ratio(case["raw"]["samples_per_s"], ceil["samples_per_s"])
                if cuda:
                    log(f"[{window} w={w}] converted shards, CUDA decode")
                    try:
                        cu = run_loader(str(converted), episodes_per_shard=None, device="cuda", **common)
                        cu.pop("emitted")
                        case["converted_cuda"] = cu
                    except Exception as e:  # noqa: BLE001
                        case["converted_cuda"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                wrep["cases"].append(case)

            # ---- LeRobot for this window, all worker counts in one subprocess
            if lerobot_python:
                log(f"[{window}] LeRobot baseline, workers {workers}")
                s0 = work / f"lerobot_sample0_{window}.pt"
                lr = run_lerobot(
                    lerobot_python,
                    str(dataset),
                    delta,
                    workers,
                    args.batch_size,
                    args.seed,
                    args.max_samples,
                    str(s0),
                    str(work / "hf"),
                    timeout=1800,
                    repeat=args.repeat,
                    torch_threads=args.torch_threads,
                )
                wrep["lerobot"] = {k: v for k, v in lr.items() if k != "runs"}
                if lr.get("ok"):
                    report["lerobot"]["versions"] = lr.get("versions")
                    for run in lr["runs"]:
                        case = next(c for c in wrep["cases"] if c["workers"] == run["workers"])
                        case["lerobot"] = run
                        per_sample = sum(len(v) for v in offsets.values())
                        run["frames_per_s"] = rnd(run["samples_per_s"] * per_sample) if run["samples_per_s"] else None
                        case["converted"]["ratio_to_lerobot"] = ratio(
                            case["converted"]["samples_per_s"], run["samples_per_s"]
                        )
                        if "raw" in case:
                            case["raw"]["ratio_to_lerobot"] = ratio(case["raw"]["samples_per_s"], run["samples_per_s"])
                        log(
                            f"  w={run['workers']}: {run['samples_per_s']} samples/s, first batch {run['first_batch_s']} s"
                        )
                    try:
                        theirs = torch.load(s0, weights_only=False)
                        ours = our_sample0(str(converted), delta, image_dtype)
                        wrep["compat"] = compare_samples(ours, theirs)
                        if image_dtype != torch.float32:
                            notes.append(
                                "sample-0 comparison with --image-dtype uint8 flags the camera dtypes: "
                                "LeRobot returns float32"
                            )
                    except Exception as e:  # noqa: BLE001
                        wrep["compat"] = {"error": f"{type(e).__name__}: {e}"}
                else:
                    log(f"  LeRobot baseline FAILED: {lr.get('error')}")
                    for case in wrep["cases"]:
                        case["lerobot"] = {"error": f"LeRobot baseline failed: {lr.get('error')}"[:300]}
                    wrep["compat"] = {"error": "LeRobot baseline failed"}
            else:
                for case in wrep["cases"]:
                    case["lerobot"] = {"skipped": report["lerobot"]["status"]}
            report["windows"].append(wrep)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)

    if args.image_dtype == "uint8" and not args.no_lerobot:
        notes.append(
            "--image-dtype uint8: our loader returns uint8 images while LeRobot always returns float32, "
            "so the LeRobot ratio is not like for like (it shows what skipping the float conversion buys)"
        )
    report["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    report["total_seconds"] = rnd(time.time() - started, 1)
    report["notes"] = notes
    write_report(report, Path(args.out), args.tag)
    log(f"wrote {args.out}/{args.tag}.json, .csv, .md in {report['total_seconds']} s")
    return 0


def write_report(report: dict[str, Any], out: Path, tag: str, *, echo: bool = True) -> None:
    rows = flat_rows(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1, default=str))
    with open(out / f"{tag}.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    md = markdown(report, rows)
    (out / f"{tag}.md").write_text(md)
    if echo:
        print()
        print(md)


if __name__ == "__main__":
    sys.exit(main())
