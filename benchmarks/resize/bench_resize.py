#!/usr/bin/env python
"""Training-resolution shards: uint8 samples/s of ``convert --resize 224x224`` shards against
full-size shards, and what the loader's decode-time resize gives without re-converting.

One dataset (default: synthetic 480x640 AV1, g=2, crf=30 with ``texture="realistic"``, about
the bitrate of real robot footage; or ``--dataset`` a LeRobot v3.0 folder) is converted twice:
full size (stream copy) and ``--resize`` (h264 unless ``--codec``). Then, in one run, rounds
interleave the cases so load on a shared machine hits them alike:

- ``full``: full-size shards, samples at 480x640;
- ``resized``: the 224x224 shards, no loader option;
- ``full+resize``: full-size shards with ``EpisodePoolDataset(resize=...)`` (decode-time resize);

each through a DataLoader with the same workers, batch, window and seed, uint8 images. A
single-process decode micro-benchmark (random frame pairs, one clip) adds: full-size decode, the
loader's uint8 resize after it, torchcodec 0.13's decoder-side Resize, and 224x224 decode.

Figures are only comparable inside one run (same machine, same load): the report gives each
case's median over rounds and the per-round ratio resized / full.

    .venv/bin/python benchmarks/resize/bench_resize.py                 # ~2-4 min on 2 cores
    .venv/bin/python benchmarks/resize/bench_resize.py --quick
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import MANIFEST_NAME, Manifest, Sidecar
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.resize import parse_size, plan_transform
from lerobot_shards.synth import synth_dataset
from lerobot_shards.video import transform_rgb

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_dataset(root: Path, args: argparse.Namespace) -> Path:
    height, width = args.synth_size
    return synth_dataset(
        root,
        num_episodes=args.episodes,
        cameras=("observation.images.front", "observation.images.top")[: args.cameras],
        height=height,
        width=width,
        codec="av1",
        gop=2,
        crf=30,
        length_range=(args.length, args.length),
        episodes_per_video_file=args.episodes,
        texture="realistic",
        seed=0,
    )


def epoch_rate(root: Path, args: argparse.Namespace, **kwargs: Any) -> dict[str, Any]:
    """One epoch through a DataLoader: samples/s after the first batch, and the image shape."""
    cameras = kwargs.pop("cameras")
    delta = {cam: [-i / args.fps for i in range(args.frames_per_sample - 1, -1, -1)] for cam in cameras}
    ds = EpisodePoolDataset(
        str(root),
        delta_timestamps=delta,
        episode_pool_size=args.pool_size,
        image_dtype=torch.uint8,
        seed=1,
        **kwargs,
    )
    loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    start = time.perf_counter()
    first = None
    n = 0
    shape = None
    for batch in loader:
        if first is None:
            first, n0 = time.perf_counter(), len(batch["index"])
            shape = list(batch[cameras[0]].shape[1:])
        n += len(batch["index"])
    end = time.perf_counter()
    steady = (n - n0) / (end - first) if end > first else None
    return {"samples": n, "samples_per_s": steady, "first_batch_s": first - start, "shape": shape}


def decode_micro(full: Path, small: Path, size: tuple[int, int], mode: str, pairs: int) -> dict[str, float]:
    """ms per random frame pair on one clip, single process, single ffmpeg thread."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import Resize

    def clip(root: Path) -> tuple[bytes, str, int]:
        m = Manifest.from_json((root / MANIFEST_NAME).read_text())
        rec = m.shards[0]
        sc = Sidecar.from_json((root / "shards" / rec.sidecar).read_text())
        entry = sc.episodes[0]
        cam = sorted(entry.clips)[0]
        member = entry.members[f"{entry.key}.{cam}.mp4"]
        with open(root / "shards" / rec.name, "rb") as f:
            f.seek(member.offset)
            data = f.read(member.size)
        return data, entry.clips[cam].frame_mappings_json(), entry.length

    torch.set_num_threads(1)
    data_full, maps_full, n = clip(full)
    data_small, maps_small, _ = clip(small)
    rng = random.Random(0)
    starts = [rng.randrange(0, n - 1) for _ in range(pairs)]
    full_dec = VideoDecoder(data_full, custom_frame_mappings=maps_full, num_ffmpeg_threads=1)
    meta = full_dec.metadata
    t = plan_transform((meta.height, meta.width), size, mode)
    native = VideoDecoder(
        data_full, custom_frame_mappings=maps_full, num_ffmpeg_threads=1, transforms=[Resize(t.scaled)]
    )
    small_dec = VideoDecoder(data_small, custom_frame_mappings=maps_small, num_ffmpeg_threads=1)
    cases = {
        "full_decode": lambda i: full_dec.get_frames_at([i, i + 1]).data,
        "full_decode+uint8_resize": lambda i: transform_rgb(full_dec.get_frames_at([i, i + 1]).data, t),
        "full_decode_torchcodec_Resize": lambda i: native.get_frames_at([i, i + 1]).data,
        "resized_clip_decode": lambda i: small_dec.get_frames_at([i, i + 1]).data,
    }
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(3):  # rounds, interleaved
        for name, fn in cases.items():
            start = time.perf_counter()
            for i in starts:
                fn(i)
            out[name].append((time.perf_counter() - start) / pairs * 1e3)
    return {k: round(min(v), 3) for k, v in out.items()}


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, help="A LeRobot v3.0 dataset instead of the synthetic one.")
    p.add_argument("--synth-size", type=lambda s: tuple(map(int, s.split("x"))), default=(480, 640), help="HxW")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--length", type=int, default=60, help="Frames per synthetic episode.")
    p.add_argument("--cameras", type=int, default=2, choices=(1, 2))
    p.add_argument("--resize", default="224x224", help="WIDTHxHEIGHT, as convert --resize.")
    p.add_argument("--mode", default="pad", choices=("pad", "crop", "stretch"))
    p.add_argument("--codec", default=None, help="--reencode codec for the resized shards (default h264).")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--frames-per-sample", type=int, default=2, help="Frames per camera per sample (a window).")
    p.add_argument("--pool-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=60, help="Frame pairs per case in the decode micro-benchmark.")
    p.add_argument("--quick", action="store_true", help="Small and fast: a smoke run.")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--tag", default=None)
    args = p.parse_args()
    if args.quick:
        args.episodes, args.length, args.rounds, args.pairs = 4, 30, 1, 20
    args.fps = 30
    tag = args.tag or ("quick" if args.quick else "latest")
    size = parse_size(args.resize)

    with tempfile.TemporaryDirectory(prefix="bench-resize-") as tmp:
        tmp = Path(tmp)
        if args.dataset is None:
            log(f"synthesizing {args.episodes} x {args.length} frames, {args.cameras} cameras, realistic AV1")
            source = make_dataset(tmp / "src", args)
        else:
            source = args.dataset
        info = json.loads((source / "meta/info.json").read_text())
        args.fps = info["fps"]
        cameras = sorted(k for k, v in info["features"].items() if v["dtype"] == "video")
        shards = {}
        for name, kw in (("full", {}), ("resized", {"resize": {"*": size}, "resize_mode": args.mode})):
            start = time.perf_counter()
            shards[name] = tmp / name
            options = ConvertOptions(episodes_per_shard=1, reencode=args.codec, **kw)
            convert_dataset(source, shards[name], options, progress=False)
            mb = Manifest.from_json((shards[name] / MANIFEST_NAME).read_text()).total_bytes / 1e6
            log(f"converted {name}: {mb:.1f} MB in {time.perf_counter() - start:.1f} s")

        cases = {
            "full": (shards["full"], {}),
            "resized": (shards["resized"], {}),
            "full+resize": (shards["full"], {"resize": size, "resize_mode": args.mode}),
        }
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            row = {}
            for name, (root, kw) in cases.items():
                row[name] = epoch_rate(root, args, cameras=cameras, **kw)
                log(f"round {r} {name}: {row[name]['samples_per_s']:.1f} samples/s {row[name]['shape']}")
            rounds.append(row)
        log("decode micro-benchmark")
        micro = decode_micro(shards["full"], shards["resized"], size, args.mode, args.pairs)
        sizes = {n: Manifest.from_json((s / MANIFEST_NAME).read_text()).total_bytes for n, s in shards.items()}

    median = {n: statistics.median(r[n]["samples_per_s"] for r in rounds) for n in cases}
    ratios = [r["resized"]["samples_per_s"] / r["full"]["samples_per_s"] for r in rounds]
    ratios_decode_time = [r["full+resize"]["samples_per_s"] / r["full"]["samples_per_s"] for r in rounds]
    result = {
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("out", "tag")
        },
        "dataset": str(args.dataset or f"synthetic {args.synth_size[0]}x{args.synth_size[1]} AV1 realistic"),
        "cameras": cameras,
        "shard_bytes": sizes,
        "rounds": rounds,
        "median_samples_per_s": median,
        "ratio_resized_over_full": {"per_round": ratios, "median": statistics.median(ratios)},
        "ratio_decode_time_resize_over_full": {
            "per_round": ratios_decode_time,
            "median": statistics.median(ratios_decode_time),
        },
        "decode_ms_per_pair": micro,
        "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count()},
        "torch": torch.__version__,
        "commit": git_commit(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{tag}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{tag}.md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        f"# Resize benchmark ({r['when']}, commit {r['commit']})",
        "",
        f"{r['dataset']}, cameras {len(r['cameras'])}, {s['episodes'] if not s['dataset'] else ''} episodes; "
        f"--resize {s['resize']} --resize-mode {s['mode']} (codec {s['codec'] or 'h264'}); DataLoader workers "
        f"{s['workers']}, batch {s['batch_size']}, {s['frames_per_sample']} frames per camera per sample, uint8; "
        f"{s['rounds']} interleaved rounds on {r['machine']['cpus']} CPUs (shared: only ratios within this run "
        f"mean anything).",
        "",
        "| case | samples/s (median) | image shape | shards MB |",
        "|---|---|---|---|",
    ]
    shard_of = {"full": "full", "resized": "resized", "full+resize": "full"}
    for name, rate in r["median_samples_per_s"].items():
        shape = r["rounds"][0][name]["shape"]
        lines.append(f"| {name} | {rate:.1f} | {shape} | {r['shard_bytes'][shard_of[name]] / 1e6:.1f} |")
    rr, rd = r["ratio_resized_over_full"], r["ratio_decode_time_resize_over_full"]
    lines += [
        "",
        f"resized / full: **{rr['median']:.2f}x** (rounds: {', '.join(f'{x:.2f}' for x in rr['per_round'])})",
        f"decode-time resize / full: {rd['median']:.2f}x (rounds: {', '.join(f'{x:.2f}' for x in rd['per_round'])})",
        "",
        "Decode micro-benchmark, one process, one clip, random frame pairs (ms per pair, best of 3):",
        "",
        "| case | ms per pair |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in r["decode_ms_per_pair"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
