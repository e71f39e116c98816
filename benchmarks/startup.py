"""Start-up at many ranks: requests per rank before the first batch, requests per second on one
prefix, time to the first batch, against the shaped bucket (moto_server behind our shaper).

    .venv/bin/python benchmarks/startup.py                   # 1 to 1,000 ranks, 0 to 8 workers
    .venv/bin/python benchmarks/startup.py --ranks 1,10 --workers 0,2 --tag quick

A rank's start-up is what it sends before its first batch: opening the dataset (the manifest),
planning its share (pure, no request), then its DataLoader workers reading their first episodes
(each worker's first shard's sidecar, then the episode's bytes). Ranks are simulated in this
process, each with a file system of its own (s3fs's instance cache cleared before each, as a
fresh process has it): every rank of a world size opens the dataset (the metadata reads of all
ranks, sent by ``--concurrency`` threads at once, as ranks starting together do: that burst's
requests per second on the dataset's prefix are reported), and rank 0 of each world size (or
of ``--first-ranks``) reaches its first batch with each worker count, counted at the shaper per rank: the
manifest and sidecars (metadata) apart from the shards' bytes (data). Writes
``results/startup/{startup[-TAG].json, summary[-TAG].md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness.shaper import PROFILES  # noqa: E402
from harness.storage import Bucket  # noqa: E402

RESULTS = HERE / "results" / "startup"
CAMERA = "observation.images.front"


def dataset(data_dir: Path, episodes: int) -> Path:
    """A converted dataset of ``episodes`` short one-camera episodes, one shard each (built once)."""
    from lerobot_shards.convert import ConvertOptions, convert_dataset
    from lerobot_shards.synth import synth_dataset

    out = data_dir / f"startup-{episodes}" / "converted"
    if (out / "manifest.json").exists():
        return out
    raw = synth_dataset(
        data_dir / f"startup-{episodes}" / "raw",
        num_episodes=episodes,
        cameras=(CAMERA,),
        height=16,
        width=64,
        length_range=(8, 12),
        episodes_per_video_file=64,
        episodes_per_data_file=64,
        seed=0,
    )
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1))
    return out


def kind(line: str) -> str:
    """What a request line asked for: the manifest, a sidecar, a shard's bytes, or something else."""
    if "manifest.json" in line:
        return "manifest"
    if ".idx.json" in line:
        return "sidecar"
    if ".tar" in line:
        return "data"
    return "other"


class Counted:
    """The shaper's request log from a mark on: counts by kind and the objects asked for more than once."""

    def __init__(self, bucket: Bucket) -> None:
        self.proxy = bucket.proxy
        self.start = len(self.proxy.log)

    def lines(self) -> list[str]:
        return [line for _, line in self.proxy.log[self.start :]]

    def summary(self) -> dict[str, Any]:
        lines = self.lines()
        by_kind = Counter(kind(line) for line in lines)
        objects = Counter(  # GETs of one metadata object (its HEAD and GET are one read)
            line.split(" ")[1].split("?")[0]
            for line in lines
            if line.startswith("GET ") and kind(line) in ("manifest", "sidecar")
        )
        return {
            "requests": len(lines),
            **{k: by_kind.get(k, 0) for k in ("manifest", "sidecar", "data", "other")},
            "metadata_read_again": sum(n - 1 for n in objects.values()),
        }


def fresh_process_state() -> None:
    """What a new rank's process starts without: s3fs's cached file systems (sessions, listings)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def open_rank(url: str, options: dict[str, Any], rank: int, world: int) -> Any:
    from lerobot_shards.loader import EpisodePoolDataset

    return EpisodePoolDataset(
        url,
        storage_options=options,
        cameras=[CAMERA],
        rank=rank,
        world_size=world,
        equal_samples_per_rank=False,
        episode_pool_size=1,
    )


def open_all(bucket: Bucket, url: str, world: int, concurrency: int) -> dict[str, Any]:
    """Every rank of ``world`` opens the dataset, ``concurrency`` at a time: the burst on the prefix."""
    fresh_process_state()
    counted = Counted(bucket)
    start = time.perf_counter()

    def one(rank: int) -> str | None:
        """The rank's error (a timed-out request of the burst, as a real rank would raise it), or None."""
        options = {**bucket.storage_options, "skip_instance_cache": True}  # its own file system, as a process
        try:
            open_rank(url, options, rank, world)
        except OSError as error:
            return str(error)
        return None

    with ThreadPoolExecutor(concurrency) as pool:
        errors = [e for e in pool.map(one, range(world)) if e is not None]
    elapsed = time.perf_counter() - start
    summary = counted.summary()
    return {
        "ranks": world,
        "open_s": round(elapsed, 2),
        "requests_per_rank": round(summary["requests"] / world, 2),
        "requests_per_s": round(summary["requests"] / elapsed, 1),
        "failed_opens": len(errors),
        "first_error": errors[0] if errors else None,
        **{f"total_{k}": v for k, v in summary.items()},
    }


def first_batches(bucket: Bucket, url: str, world: int, rank: int, workers: int) -> dict[str, Any]:
    """One rank from a fresh state to every worker's first batch: its requests, and its first batch's time."""
    from torch.utils.data import DataLoader

    fresh_process_state()
    counted = Counted(bucket)
    start = time.perf_counter()
    ds = open_rank(url, bucket.storage_options, rank, world)
    loader = iter(DataLoader(ds, batch_size=4, num_workers=workers))
    next(loader)
    first_s = time.perf_counter() - start
    for _ in range(max(1, workers) - 1):  # round-robin: batch i comes from worker i
        next(loader, None)
    summary = counted.summary()
    del loader
    return {"ranks": world, "rank": rank, "workers": workers, "first_batch_s": round(first_s, 2), **summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,10,100,1000")
    ap.add_argument("--workers", default="0,1,2,4,8")
    ap.add_argument(
        "--first-ranks", default="", help="world sizes whose rank 0 reaches its first batches (default: --ranks)"
    )
    ap.add_argument("--episodes", type=int, default=1024, help="episodes (one shard each)")
    ap.add_argument("--profile", default="cross-region", choices=sorted(PROFILES))
    ap.add_argument("--concurrency", type=int, default=32, help="ranks opening at once")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BENCH_DATA", "/tmp/lerobot-shards-bench")))
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    local = dataset(args.data_dir, args.episodes)
    ranks = [int(x) for x in args.ranks.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    with Bucket(PROFILES[args.profile], args.data_dir / "startup-logs") as bucket:
        url = bucket.upload(local, "startup")
        open_rank(url, bucket.storage_options, 0, 1)  # this process's imports and first connection: not a rank's
        opens = []
        for world in ranks:
            opens.append(open_all(bucket, url, world, args.concurrency))
            print(json.dumps(opens[-1]), flush=True)
        write(args, opens, [])  # kept if the first batches do not finish
        firsts = []
        for world in [int(x) for x in args.first_ranks.split(",")] if args.first_ranks else ranks:
            for w in workers:
                if world * max(1, w) > args.episodes:
                    continue  # a consumer without an episode has no first batch
                firsts.append(first_batches(bucket, url, world, 0, w))
                print(json.dumps(firsts[-1]), flush=True)
    write(args, opens, firsts)


def write(args: argparse.Namespace, opens: list[dict[str, Any]], firsts: list[dict[str, Any]]) -> None:
    load = os.getloadavg()
    name = f"startup-{args.tag}" if args.tag else "startup"
    summary_name = f"summary-{args.tag}.md" if args.tag else "summary.md"
    lines = [
        f"# Start-up at many ranks ({args.episodes} one-camera episodes, one shard each; shaper profile "
        f"{args.profile}: {PROFILES[args.profile].describe()}; {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} at the end: shared machine)",
        "",
        f"Every rank opens the dataset, {args.concurrency} at once (the burst on one prefix):",
        "",
        "| ranks | requests per rank | of them manifest | requests/s on the prefix | all opened in s | failed |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['ranks']:,} | {r['requests_per_rank']} | {r['total_manifest'] / r['ranks']:.2f} | "
        f"{r['requests_per_s']} | {r['open_s']} | {r['failed_opens']} |"
        for r in opens
    ]
    lines += [
        "",
        "A rank from a fresh process to every worker's first batch (manifest and sidecars are metadata; "
        "read again: a metadata object asked for more than once):",
        "",
        "| ranks | rank | workers | requests | manifest | sidecars | data | other | metadata read again | first batch s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['ranks']:,} | {r['rank']} | {r['workers']} | {r['requests']} | {r['manifest']} | {r['sidecar']} | "
        f"{r['data']} | {r['other']} | {r['metadata_read_again']} | {r['first_batch_s']} |"
        for r in firsts
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {"settings": settings, "load_average": [round(x, 1) for x in load], "opens": opens, "first": firsts}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (RESULTS / summary_name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
