"""Start-up at many ranks: requests per rank before the first batch, requests per second on one
prefix, time to the first batch, against the shaped bucket (moto_server behind our shaper) and
the loopback Hub server (tests/hub_server.py behind the same shaper, the raw LeRobot dataset).

    .venv/bin/python benchmarks/startup.py                   # 1 to 1,000 ranks, 0 to 8 workers
    .venv/bin/python benchmarks/startup.py --ranks 1,10 --workers 0,2 --sources bucket --tag quick

A rank's start-up is what it sends before its first batch: opening the dataset (the metadata: a
converted dataset's manifest and sidecar pack; a raw dataset's listing and meta/ files), planning
its share (pure, no request), then its DataLoader workers reading their first episodes (data:
the shards' bytes; a raw dataset's parquet and mp4 files). Ranks are simulated in this process,
each with file systems of its own (s3fs's instance cache and the Hub source's per-process
listings cleared before each, as a fresh process has them): every rank of a world size opens the
dataset (the metadata reads of all ranks, sent by ``--concurrency`` threads at once, as ranks
starting together do: that burst's requests per second on the prefix are reported), and rank 0
of each world size (or of ``--first-ranks``) reaches every worker's first batch with each worker
count, counted at the shaper per rank, metadata apart from data. Writes
``results/startup/{startup[-TAG].json, summary[-TAG].md}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import subprocess
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
HUB_REPO = "bench/startup"
BATCH = 4
PREFETCH_FACTOR = 2  # the DataLoader's default: batches asked of each worker ahead
METADATA = ("manifest", "pack", "sidecar", "listing", "meta")  # the kinds of request that are metadata


def dataset(data_dir: Path, episodes: int) -> Path:
    """A converted dataset of ``episodes`` short one-camera episodes, one shard each (built once);
    its raw source is the folder ``raw`` beside it (what the Hub server serves)."""
    from lerobot_shards.convert import ConvertOptions, convert_dataset
    from lerobot_shards.synth import synth_dataset

    out = data_dir / f"startup-{episodes}" / "converted"
    if (out / "manifest.json").exists() and (out / "sidecars.pack").exists():
        return out
    raw = data_dir / f"startup-{episodes}" / "raw"
    if not (raw / "meta" / "info.json").exists():
        synth_dataset(
            raw,
            num_episodes=episodes,
            cameras=(CAMERA,),
            height=16,
            width=64,
            length_range=(8, 12),
            episodes_per_video_file=64,
            episodes_per_data_file=64,
            seed=0,
        )
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1), overwrite=True)
    return out


def kind(line: str) -> str:
    """What a request line asked for: the manifest, the sidecar pack, a sidecar, a Hub listing or
    revision (``listing``), a raw dataset's meta/ file, a shard's or raw file's bytes (``data``), or
    something else."""
    if "manifest.json" in line:
        return "manifest"
    if "sidecars.pack" in line:
        return "pack"
    if ".idx.json" in line:
        return "sidecar"
    if " /api/" in line:
        return "listing"
    if "/meta/" in line:
        return "meta"
    if ".tar" in line or "/data/" in line or "/videos/" in line:
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
            if line.startswith("GET ") and kind(line) in ("manifest", "pack", "sidecar", "meta")
        )
        return {
            "requests": len(lines),
            "metadata": sum(by_kind.get(k, 0) for k in METADATA),
            **{k: by_kind.get(k, 0) for k in (*METADATA, "data", "other")},
            "metadata_read_again": sum(n - 1 for n in objects.values()),
        }


def fresh_process_state() -> None:
    """What a new rank's process starts without: s3fs's cached file systems (sessions, listings), and
    the Hub source's listings, metadata fetched with them and commits found (per process)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    if "lerobot_shards.integrations.hub" in sys.modules:
        from huggingface_hub import HfFileSystem

        from lerobot_shards.integrations import hub

        HfFileSystem.clear_instance_cache()
        hub.HubFileSystem.clear_instance_cache()  # fsspec caches each class's instances apart
        for cache in (hub._listings, hub._metadata, hub._found, hub._bucket_roots):
            cache.clear()


class HubSource:
    """tests/hub_server.py serving the raw dataset as ``HUB_REPO``, behind the shaper: the
    ``Bucket`` of a Hub source (``proxy``'s log counts its requests; ``HF_ENDPOINT`` points at it)."""

    def __init__(self, profile: Any, raw: Path) -> None:
        from harness.shaper import ShapedProxy

        self.server = subprocess.Popen(
            [sys.executable, str(HERE.parent / "tests" / "hub_server.py"), f"{HUB_REPO}={raw}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.server.stdout is not None
        host, port = self.server.stdout.readline().strip().split("//")[1].rsplit(":", 1)
        self.proxy = ShapedProxy((host, int(port)), profile).start()
        os.environ["HF_ENDPOINT"] = self.proxy.url
        os.environ["HF_HUB_DISABLE_XET"] = "1"
        self.storage_options: dict[str, Any] = {}

    def __enter__(self) -> HubSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.stop()
        self.server.kill()
        self.server.wait()


def open_rank(url: str, options: dict[str, Any], rank: int, world: int, hub: bool = False) -> Any:
    """Rank ``rank`` of ``world`` opens the dataset; a raw one read from the Hub in virtual shards of
    one episode, as the bucket's conversion has them, so both sources split alike over the ranks."""
    from lerobot_shards.loader import EpisodePoolDataset

    return EpisodePoolDataset(
        url,
        storage_options=options,
        cameras=[CAMERA],
        rank=rank,
        world_size=world,
        equal_samples_per_rank=False,
        episode_pool_size=1,
        **({"episodes_per_shard": 1} if hub else {}),
    )


def open_all(bucket: Bucket | HubSource, url: str, world: int, concurrency: int) -> dict[str, Any]:
    """Every rank of ``world`` opens the dataset, ``concurrency`` at a time: the burst on the prefix."""
    fresh_process_state()
    counted = Counted(bucket)
    start = time.perf_counter()

    hub = isinstance(bucket, HubSource)

    def one(rank: int) -> str | None:
        """The rank's error (a timed-out request of the burst, as a real rank would raise it), or None."""
        if hub:  # the Hub source's listings are per process: each rank in turn, from a fresh state
            fresh_process_state()
        options = bucket.storage_options if hub else {**bucket.storage_options, "skip_instance_cache": True}
        try:
            open_rank(url, options, rank, world, hub)
        except OSError as error:
            return str(error)
        return None

    with ThreadPoolExecutor(1 if hub else concurrency) as pool:
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


def first_batches(bucket: Bucket | HubSource, url: str, world: int, rank: int, workers: int) -> dict[str, Any]:
    """One rank from a fresh state to every worker's first batch: its requests, and its first batch's
    time. Where the rank has fewer episodes than workers (1,000 ranks of 1,024 episodes), the workers
    holding one reach their first batch and the others end at once: the rank's whole epoch is read."""
    from torch.utils.data import DataLoader

    fresh_process_state()
    counted = Counted(bucket)
    start = time.perf_counter()
    ds = open_rank(url, bucket.storage_options, rank, world, isinstance(bucket, HubSource))
    loader = iter(DataLoader(ds, batch_size=BATCH, num_workers=workers))
    first = next(loader, None)  # None: the rank holds no episode (its metadata requests still count)
    first_s = round(time.perf_counter() - start, 2) if first is not None else None
    for _ in range(max(1, workers) - 1):  # round-robin: batch i comes from worker i
        next(loader, None)
    summary = counted.summary()
    lines = counted.lines()
    del loader
    per_consumer = read_ahead(ds, lines, workers) if isinstance(bucket, Bucket) else {}
    consumers = per_consumer.get("consumers_with_episodes", max(1, workers))
    return {
        "ranks": world,
        "rank": rank,
        "workers": workers,
        "first_batch_s": first_s,
        **summary,
        "data_per_consumer": round(summary["data"] / max(1, consumers), 1),
        **per_consumer,
        "load_average": round(os.getloadavg()[0], 1),
    }


def read_ahead(ds: Any, lines: list[str], workers: int) -> dict[str, Any]:
    """Each consumer's shard reads (one episode per shard, so a shard is an episode) against what
    the loader documents it may have read by then (docs/object-storage.md): the episodes its reader
    handed over for the samples emitted so far (those of the batches the DataLoader has asked of it,
    ``PREFETCH_FACTOR`` + 1 per worker once every worker's first batch is taken, one batch without
    workers, and the samples decoded ahead of them, 2 per decode thread and 1), its read-ahead queue
    (``prefetch_episodes``), the episode its reader holds until the queue has room, and the shards
    holding the next ``prefetch_episodes`` episodes, fetched in the background. ``over_bound``:
    consumers past it."""
    from lerobot_shards.cpus import cores_per_rank
    from lerobot_shards.loader.decoding.decoders import MAX_AUTO_DECODE_THREADS

    read = {int(m) for line in lines if kind(line) == "data" for m in re.findall(r"shard-(\d+)\.tar", line)}
    ahead = ds.read.prefetch_episodes
    batches = PREFETCH_FACTOR + 1 if workers else 1
    cores = cores_per_rank()  # decode threads as ``decoders.auto_decode_threads`` chooses them
    threads = min(MAX_AUTO_DECODE_THREADS, cores // workers) if workers else max(1, min(MAX_AUTO_DECODE_THREADS, cores))
    reads, bounds = [], []
    for worker in range(max(1, workers)):
        start = ds.epoch_order.start(0, None, worker, workers)
        if not start.plan.episodes:
            continue
        emitted = itertools.islice(start.sampler, batches * BATCH + 2 * threads + 1)
        handed = max(e.position for e in emitted) + 1  # the reader hands episodes over in list order
        reads.append(sum(1 for shard, _ in start.plan.episodes if shard in read))
        bounds.append(min(len(start.plan.episodes), handed + 2 * ahead + 1))
    return {
        "consumers_with_episodes": len(reads),
        "data_per_consumer_max": max(reads, default=0),
        "data_bound_per_consumer": max(bounds, default=0),
        "over_bound": sum(r > b for r, b in zip(reads, bounds)),
    }


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
    ap.add_argument("--sources", default="bucket,hub", help="bucket (converted, shaped S3), hub (raw, shaped Hub)")
    ap.add_argument("--hub-ranks", default="1,10,100,1000", help="world sizes opened from the Hub (one rank at a time)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    local = dataset(args.data_dir, args.episodes)
    workers = [int(x) for x in args.workers.split(",")]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    last = RESULTS / (f"startup-{args.tag}.json" if args.tag else "startup.json")
    if last.exists():  # the sources not run this time keep their last results
        kept = json.loads(last.read_text())["results"]
        results.update({k: v for k, v in kept.items() if k not in args.sources.split(",")})
    for source in args.sources.split(","):
        ranks = [int(x) for x in (args.hub_ranks if source == "hub" else args.ranks).split(",")]
        results[source] = {"opens": [], "first": []}
        with (
            Bucket(PROFILES[args.profile], args.data_dir / "startup-logs")
            if source == "bucket"
            else HubSource(PROFILES[args.profile], local.parent / "raw")
        ) as where:
            url = where.upload(local, "startup") if isinstance(where, Bucket) else HUB_REPO
            open_rank(url, where.storage_options, 0, 1, source == "hub")  # imports, first connection: not a rank's
            for world in ranks:
                results[source]["opens"].append(open_all(where, url, world, args.concurrency))
                print(json.dumps({"source": source, **results[source]["opens"][-1]}), flush=True)
            write(args, results)  # kept if the first batches do not finish
            for world in [int(x) for x in args.first_ranks.split(",")] if args.first_ranks else ranks:
                for w in workers:
                    results[source]["first"].append(first_batches(where, url, world, 0, w))
                    print(json.dumps({"source": source, **results[source]["first"][-1]}), flush=True)
            write(args, results)


def write(args: argparse.Namespace, results: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    load = os.getloadavg()
    seen = [r["load_average"] for got in results.values() for r in got["first"]] or [round(load[0], 1)]
    loads = f"{min(seen)}-{max(seen)}"
    name = f"startup-{args.tag}" if args.tag else "startup"
    summary_name = f"summary-{args.tag}.md" if args.tag else "summary.md"
    lines = [
        f"# Start-up at many ranks ({args.episodes} one-camera episodes; shaper profile {args.profile}: "
        f"{PROFILES[args.profile].describe()}; {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{loads} at the first batches: shared machine, so the times are under load; the request counts do "
        "not depend on load)",
        "",
        "Sources: **bucket**, the converted dataset (one episode per shard) on moto_server behind the shaper; "
        "**hub**, the raw LeRobot v3.0 dataset on tests/hub_server.py behind the shaper, read by repo id. "
        "Metadata: the manifest, the sidecar pack, sidecar files; the Hub's API calls (refs, revision, listing) "
        "and meta/ files. Data: shard bytes; raw parquet and mp4 files.",
    ]
    for source, got in results.items():
        bucket = source == "bucket"
        lines += [
            "",
            f"## {source}: every rank opens the dataset"
            + (f", {args.concurrency} at once (the burst on one prefix)" if bucket else ", one at a time"),
            "",
            "| ranks | requests per rank | metadata per rank | requests/s on the prefix | all opened in s | failed |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['ranks']:,} | {r['requests_per_rank']} | {r['total_metadata'] / r['ranks']:.2f} | "
            f"{r['requests_per_s']} | {r['open_s']} | {r['failed_opens']} |"
            for r in got["opens"]
        ]
        lines += [
            "",
            f"## {source}: a rank from a fresh process to every worker's first batch",
            "",
            "Read again: a metadata object asked for more than once. Data per consumer: the data requests over "
            + (
                "the consumers holding an episode (max(1, workers), fewer at 1,000 ranks)."
                if bucket
                else "max(1, workers), though at 1,000 ranks some workers hold no episode. A raw episode's data "
                "is ranged reads of its data parquet file and of its camera's mp4 (whose index, at the file's "
                "end, each worker reads for itself)."
            )
            + (
                " Max and bound: the most shards one consumer read (one episode each) and what the loader "
                "documents it may have read by then: the episodes of the batches asked of it (3 per worker, the "
                "DataLoader's 2 ahead and the one asked after its first batch; 1 without workers) and of the "
                "samples decoded ahead of them (2 per decode thread and 1), its read-ahead queue (`prefetch_episodes`, 1 here), the episode its reader holds until the queue "
                "has room, and the shards of the next `prefetch_episodes` episodes fetched in the background."
                if bucket
                else ""
            ),
            "",
            "| ranks | workers | requests | metadata | "
            + ("manifest | pack | sidecar files" if bucket else "API (refs, revision, listing) | meta/ files")
            + " | data | data per consumer | "
            + ("max | bound | consumers over it | " if bucket else "")
            + "other | metadata read again | first batch s |",
            "|---:|---:|---:|---:|"
            + ("---:|---:|---:|---:|---:|---:|" if bucket else "---:|---:|")
            + "---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['ranks']:,} | {r['workers']} | {r['requests']} | {r['metadata']} | "
            + (f"{r['manifest']} | {r['pack']} | {r['sidecar']}" if bucket else f"{r['listing']} | {r['meta']}")
            + f" | {r['data']} | {r['data_per_consumer']} | "
            + (
                f"{r['data_per_consumer_max']} | {r['data_bound_per_consumer']} | {r['over_bound']} | "
                if bucket
                else ""
            )
            + f"{r['other']} | {r['metadata_read_again']} | {r['first_batch_s'] or 'no episode'} |"
            for r in got["first"]
        ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {"settings": settings, "load_average": [round(x, 1) for x in load], "results": results}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (RESULTS / summary_name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
