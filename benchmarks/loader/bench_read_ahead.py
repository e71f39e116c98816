"""How fast one consumer's reader hands over a converted dataset's episodes from the shaped bucket.

    .venv/bin/python benchmarks/loader/bench_read_ahead.py DATASET [--rounds 3] [--depth 8] [--profile cross-region]

Uploads the converted ``DATASET`` to the benchmark's bucket (moto_server behind ``harness/shaper.py``),
opens it as a DataLoader worker would, reads the first episode (the S3 client is built and the first
shard lands: not measured), then times an ``EpisodeReader`` handing over every episode of the other
shards in order, with no decoding: what read-ahead across shards (sidecars and shard bytes fetched
before the reader reaches them) is worth when the loader drains episodes faster than a round trip
per shard. Load on a shared machine barely moves it: the time is round trips and bandwidth.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.shaper import PROFILES  # noqa: E402
from harness.storage import Bucket  # noqa: E402
from lerobot_shards.loader.options import ReadOptions  # noqa: E402
from lerobot_shards.loader.read.reader import EpisodeReader  # noqa: E402
from lerobot_shards.loader.read.sources import open_source  # noqa: E402


def hand_over_seconds(url: str, storage_options: dict, depth: int) -> tuple[int, int, float]:
    """(episodes, shards, seconds) for one reader over every shard but the first."""
    source = open_source(url, ReadOptions(storage_options=storage_options))
    try:
        first, rest = source.info.shards[0], source.info.shards[1:]
        source.read_episode(first.index, first.episodes[0])
        episodes = [(s.index, e) for s in rest for e in s.episodes]
        start = time.perf_counter()
        reader = EpisodeReader(source, episodes, iter([(0, i) for i in range(len(episodes))]), depth)
        try:
            for _ in episodes:
                reader.next()
        finally:
            reader.close()
        return len(episodes), len(rest), time.perf_counter() - start
    finally:
        source.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dataset", type=Path, help="a converted dataset (local)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=8, help="episodes read ahead (prefetch_episodes; the pool size)")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cross-region")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as logs, Bucket(PROFILES[args.profile], Path(logs)) as bucket:
        url = bucket.upload(args.dataset, "ds")
        for _ in range(args.rounds):
            episodes, shards, seconds = hand_over_seconds(url, bucket.storage_options, args.depth)
            print(f"{episodes} episodes of {shards} shards handed over in {seconds:.3f} s", flush=True)


if __name__ == "__main__":
    main()
