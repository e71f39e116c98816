"""The benchmark's datasets: a synthetic LeRobot v3.0 dataset with the weight of real footage, and its conversion.

Built once per size and options under ``DATA_DIR/<key>/`` (``raw/`` and ``converted-<hash>/``)
and reused by later runs; a build killed half-way is redone (synth_dataset writes info.json last,
the converter writes its manifest last). Frames are 640x480 AV1 (LeRobot's encoder settings: g=2,
crf=30) from ``synth --texture realistic``: about 21 KB per frame, like real robot footage. Its
clips are painted and encoded by one process per usable CPU (the same bytes as one process's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

CAMERAS = ("observation.images.front", "observation.images.top")
SIZES: dict[str, dict[str, Any]] = {
    # the end-to-end test: seconds to build; several mp4s per camera, as large datasets have
    "tiny": dict(num_episodes=6, height=96, width=128, length_range=(30, 50), episodes_per_file=3),
    # small frames behind a bucket: request latency, not decoding, bounds the loader (issue 21's
    # converted-from-bucket against raw-from-bucket case); one mp4 per camera
    "small": dict(num_episodes=40, height=96, width=128, length_range=(100, 200), episodes_per_file=40),
    # `make bench`: ~150 MB, 24 episodes of 3-7 s at 30 fps, two cameras; one mp4 per camera, as
    # LeRobot writes a dataset this small (it starts a new file at 500 MB of video, 100 MB of data)
    "quick": dict(num_episodes=24, height=480, width=640, length_range=(100, 200), episodes_per_file=24),
    # worker layouts on a many-core machine (benchmarks/layouts.sh): ~230 MB, enough episodes and
    # shards that 16 workers each own several; built in about a minute on 16 cores
    "wide": dict(num_episodes=64, height=480, width=640, length_range=(60, 120), episodes_per_file=32),
    # the README figures: ~2.5 GB, ~500 MB mp4s
    "full": dict(num_episodes=160, height=480, width=640, length_range=(150, 450), episodes_per_file=40),
}
# shards small enough that every worker owns several (the default 512 MB suits TB-scale datasets)
CONVERT_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"episodes_per_shard": 1},
    "small": {"shard_bytes": "2MB"},
    "quick": {"shard_bytes": "16MB"},
    "wide": {"shard_bytes": "4MB"},
    "full": {"shard_bytes": "128MB"},
}


def convert_options(size: str, given: dict[str, Any]) -> dict[str, Any]:
    """The size's default conversion with ``given`` on top; a shard size or an episode count per
    shard given replaces the default's other way of sizing shards (the converter takes one)."""
    defaults = dict(CONVERT_DEFAULTS[size])
    if {"shard_bytes", "episodes_per_shard"} & set(given):
        defaults.pop("shard_bytes", None)
        defaults.pop("episodes_per_shard", None)
    return {**defaults, **given}


def _key(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def raw_dataset(data_dir: Path, size: str, codec: str = "av1", seed: int = 0) -> Path:
    """The raw dataset of ``size`` (built on first use)."""
    from lerobot_shards.cpus import usable_cpus
    from lerobot_shards.synth import synth_dataset

    spec = dict(SIZES[size], cameras=CAMERAS, codec=codec, gop=2, crf=30, texture="realistic", seed=seed)
    root = data_dir / f"{size}-{_key(spec)}" / "raw"
    per_file = spec.pop("episodes_per_file")
    if not (root / "meta/info.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        print(f"[bench] building the {size} dataset in {root} (once; later runs reuse it)", flush=True)
        synth_dataset(
            root, episodes_per_video_file=per_file, episodes_per_data_file=per_file, workers=usable_cpus(), **spec
        )
    return root


def external_dataset(data_dir: Path, path: Path) -> Path:
    """A LeRobot v3.0 dataset of the user's (real footage) in place of a synthetic one: linked as
    ``DATA_DIR/external-<name>-<key>/raw``, so that its conversions land beside the link, never in
    the dataset's own folder."""
    path = path.resolve()
    if not (path / "meta/info.json").is_file():
        raise SystemExit(f"--raw {path}: not a LeRobot v3.0 dataset (no meta/info.json)")
    root = data_dir / f"external-{path.name}-{_key(str(path))}" / "raw"
    if not root.is_symlink():
        root.parent.mkdir(parents=True, exist_ok=True)
        root.symlink_to(path, target_is_directory=True)
    return root


def converted_dataset(raw: Path, options: dict[str, Any]) -> Path:
    """``raw`` converted with ``options``, next to it: ``ConvertOptions`` fields (sizes such as
    ``shard_bytes=16MB`` parsed) and any other ``convert_dataset`` keyword."""
    from lerobot_shards.convert.plan import ConvertOptions, parse_size
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.format import MANIFEST_NAME

    dest = raw.parent / f"converted-{_key(options)}"
    if not (dest / MANIFEST_NAME).is_file():
        print(f"[bench] converting into {dest} with {options or 'defaults'}", flush=True)
        fields = {f.name for f in dataclasses.fields(ConvertOptions)}
        given = {k: parse_size(v) if k == "shard_bytes" else v for k, v in options.items() if k in fields}
        run = {k: v for k, v in options.items() if k not in fields}
        convert_dataset(raw, dest, ConvertOptions(**given), workers=min(4, os.cpu_count() or 1), progress=False, **run)
    return dest


def raw_plan(options: dict[str, Any]) -> dict[str, int]:
    """The virtual shard plan a raw source needs to emit what the conversion with ``options`` emits."""
    from lerobot_shards.convert.plan import ConvertOptions, parse_size

    if options.get("episodes_per_shard"):
        return {"episodes_per_shard": int(options["episodes_per_shard"])}
    return {"shard_bytes": parse_size(options.get("shard_bytes") or ConvertOptions().shard_bytes)}


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
