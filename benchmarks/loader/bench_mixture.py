"""A mixture's read speed against its slowest member alone: samples/s, same machine, same run.

    .venv/bin/python benchmarks/loader/bench_mixture.py                   # 3 sources at 10, 15, 30 fps
    .venv/bin/python benchmarks/loader/bench_mixture.py --rounds 5 --workers 2 --tag quick

Three synthetic datasets (identity-painted, ``--texture`` frames, one camera, at 10, 15 and 30
fps, each converted to shards) are read alone with ``EpisodePoolDataset`` and together with
``MixtureDataset`` (weights proportional to their sizes: every frame of each once per epoch),
with the same options (``--workers`` DataLoader workers, batch ``--batch-size``, uint8 frames,
``--window`` frames of the camera per sample). Cases run interleaved, ``--rounds`` times, so a
slow spell of a shared machine hits them alike; each reports its median round's samples/s over
``--batches`` batches after one warm-up batch. The figure of merit is the mixture's samples/s
over its slowest member's (the issue's target: at least 0.9). Writes
``results/mixture[-TAG].{json,md}`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset, Mixture, MixtureDataset, MixtureSource
from lerobot_shards.synth import synth_dataset

RESULTS = Path(__file__).resolve().parent / "results"
CAMERA = "observation.images.front"
FPS = (10, 15, 30)


def make_sources(base: Path, args: argparse.Namespace) -> dict[str, Path]:
    """One converted dataset per fps (built once under ``base``)."""
    out = {}
    for fps in FPS:
        raw, shards = base / f"raw{fps}", base / f"shards{fps}"
        if not (raw / "meta/info.json").is_file():
            synth_dataset(
                raw,
                num_episodes=args.episodes,
                fps=fps,
                cameras=(CAMERA,),
                height=args.height,
                width=args.width,
                length_range=(args.length // 2, args.length),
                texture=args.texture,
                seed=fps,
            )
        if not (shards / "manifest.json").is_file():
            convert_dataset(raw, shards, ConvertOptions(episodes_per_shard=4), progress=False)
        out[f"{fps}fps"] = shards
    return out


def measure(make: Any, args: argparse.Namespace) -> dict[str, Any]:
    """samples/s of ``--batches`` batches after a warm-up one, with a fresh dataset and DataLoader."""
    ds = make()
    loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    it = iter(loader)
    next(it)
    start, samples, cpu = time.perf_counter(), 0, time.process_time()
    for _, batch in zip(range(args.batches), it):
        samples += len(batch["index"])
    seconds = time.perf_counter() - start
    del it
    return {
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "main_cpu_s": time.process_time() - cpu,
    }


def _each(results: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['samples_per_s']:.1f}" for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "lerobot-shards-bench-mixture")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--length", type=int, default=60, help="longest episode; lengths in [length/2, length]")
    ap.add_argument("--height", type=int, default=96)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--texture", default="realistic", choices=("flat", "realistic"))
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--window", type=int, default=2, help="camera frames per sample (delta_timestamps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    sources = make_sources(args.data, args)
    common = dict(image_dtype=torch.uint8, seed=0)

    window = {CAMERA: [-i / 5 for i in reversed(range(args.window))]}  # fifths of a second: on every fps's grid
    makers: dict[str, Any] = {
        name: (lambda p=path: EpisodePoolDataset(str(p), delta_timestamps=window, **common))
        for name, path in sources.items()
    }
    mixture = Mixture([MixtureSource(str(p), name=n, repeat=1) for n, p in sources.items()])
    makers["mixture"] = lambda: MixtureDataset(mixture, delta_timestamps=window, **common)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in makers}
    for k in range(args.rounds):
        for name, make in makers.items():
            result = measure(make, args)
            rounds[name].append(result)
            print(
                f"[mixture bench] round {k + 1}/{args.rounds} {name}: {result['samples_per_s']:.1f} samples/s",
                flush=True,
            )
    medians = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in rounds.items()}
    slowest = min((n for n in medians if n != "mixture"), key=medians.__getitem__)
    ratio = medians["mixture"] / medians[slowest]
    report = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "rounds": rounds,
        "median_samples_per_s": medians,
        "slowest_member": slowest,
        "mixture_over_slowest": ratio,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "mixture" + (f"-{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=1))
    lines = [
        f"Mixture of {len(sources)} converted sources vs each alone: {args.workers} workers, batch {args.batch_size}, "
        f"{args.window} frame(s) of one {args.height}x{args.width} {args.texture} camera per sample, "
        f"median of {args.rounds} rounds of {args.batches} batches",
        "",
        "| case | samples/s (median) | rounds |",
        "|---|---|---|",
        *(f"| {n} | {medians[n]:.1f} | {_each(rounds[n])} |" for n in makers),
        "",
        f"mixture / slowest member ({slowest}): {ratio:.2f}x",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
