"""The frame cache's cost per epoch and a consumer's own memory (USS) with and without it.

Runs epochs of one consumer (no DataLoader workers, uint8, a ``[-1, 0]`` window per camera) on a
synthetic dataset of real-footage weight, once without the cache and then cold and warm through
one: wall and CPU seconds per epoch, frames decoded at emit and filled, and the process's unique
set size after each epoch. The claim checked: decoded frames live in the page cache, so USS does
not grow with the cache (the warm epochs read every frame back). Not a test: figures only.

    python benchmarks/frame_cache_memory.py [--episodes 16] [--size 240x320] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil
import torch

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

CAMERAS = ("observation.images.front", "observation.images.top")


def epoch(root: Path, cache: Path | None, fps: int) -> dict[str, float]:
    ds = EpisodePoolDataset(
        str(root),
        episodes_per_shard=2,
        delta_timestamps={cam: [-1 / fps, 0.0] for cam in CAMERAS},
        image_dtype=torch.uint8,
        frame_cache_dir=None if cache is None else str(cache),
    )
    me = psutil.Process()
    wall, cpu = time.perf_counter(), time.process_time()
    n = sum(1 for _ in ds)
    total = ds.stats()["total"]
    return {
        "samples": n,
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_ms_per_sample": round(1000 * (time.process_time() - cpu) / n, 3),
        "frames_decoded": total["frames_decoded"],
        "decode_cpu_s": round(total["decode_cpu_seconds"], 3),
        "frames_filled": total.get("frames_filled", 0.0),
        "fill_cpu_s": round(total.get("fill_cpu_seconds", 0.0), 3),
        "cache_read_cpu_s": round(total.get("cache_read_cpu_seconds", 0.0), 3),
        "uss_mib": round(me.memory_full_info().uss / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--size", default="240x320", help="HEIGHTxWIDTH")
    parser.add_argument("--out", default=None, help="where the dataset and cache go (default: a temp dir)")
    args = parser.parse_args()
    height, width = (int(x) for x in args.size.split("x"))
    base = Path(args.out or tempfile.mkdtemp(prefix="fc-bench-"))
    root = base / f"ds-{args.episodes}-{args.size}"
    if not (root / "meta/info.json").exists():
        synth_dataset(
            root,
            num_episodes=args.episodes,
            cameras=CAMERAS,
            height=height,
            width=width,
            codec="av1",
            texture="realistic",
            length_range=(60, 90),
        )
    cache = base / "frame-cache"
    rows = {"no cache": epoch(root, None, 30)}
    for i in range(3):
        rows[f"cache, epoch {i} ({'cold' if i == 0 else 'warm'})"] = epoch(root, cache, 30)
    rows["no cache, after"] = epoch(root, None, 30)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
