"""Raw streaming from a Hub-shaped server against the same dataset on local disk (issue 33).

The dataset is served by ``tests/hub_server.py`` (the Hub's HTTP API, run as its own process with a
request-rate limit answered by 429 + Retry-After) behind ``harness/shaper.py`` (per-request latency,
shared bandwidth), ``HF_ENDPOINT`` pointing at the shaper. For each source (the local folder, then the
repo id) a fresh ``EpisodePoolDataset`` is read through a ``DataLoader``: seconds to the first batch
(dataset construction included: revision resolution and listing for the Hub), samples/s over the
rest of the epoch, and the requests the Hub got before the first batch.

    .venv/bin/python benchmarks/hub_stream.py --size small --workers 2 --latency-ms 30 --mb-per-s 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def _stream(source: str, workers: int, batch: int, requests: Callable[[], int]) -> dict[str, float]:
    from torch.utils.data import DataLoader

    from lerobot_shards.loader import EpisodePoolDataset

    started = time.perf_counter()
    before = requests()
    ds = EpisodePoolDataset(source, seed=0, episode_pool_size=4)
    loader = DataLoader(ds, batch_size=batch, num_workers=workers)
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - started
    startup_requests = requests() - before
    n, t0 = 0, time.perf_counter()
    for b in it:
        n += len(b["index"])
    rest = time.perf_counter() - t0
    return {
        "first_batch_s": first_s,
        "samples_per_s": n / rest if rest else 0.0,
        "samples": n + len(first["index"]),
        "requests_before_first_batch": startup_requests,
        "requests": requests() - before,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--mb-per-s", type=float, default=100.0)
    ap.add_argument("--requests-per-s", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=REPO / "data/bench")
    ap.add_argument("--out", type=Path, default=REPO / "data/bench/hub_stream.json")
    args = ap.parse_args()

    from harness import data
    from harness.shaper import Profile, ShapedProxy

    raw = data.raw_dataset(args.data_dir.resolve(), args.size)
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests/hub_server.py"), f"bench/{args.size}={raw}"]
        + ["--requests-per-s", str(args.requests_per_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        upstream = server.stdout.readline().strip().rsplit(":", 1)
        profile = Profile(args.latency_ms / 1000, args.mb_per_s * 1e6)
        with ShapedProxy((upstream[0].split("//")[1], int(upstream[1])), profile) as proxy:
            os.environ["HF_ENDPOINT"] = proxy.url
            results = []
            for r in range(args.rounds):
                local = _stream(str(raw), args.workers, args.batch, lambda: proxy.requests)
                hub = _stream(f"bench/{args.size}", args.workers, args.batch, lambda: proxy.requests)
                from lerobot_shards.integrations import hub as hub_module

                hub_module._listings.clear()  # the next round starts cold, as a new job would
                hub_module._found.clear()
                hub_module.HubFileSystem.clear_instance_cache()
                results.append({"round": r, "local": local, "hub": hub})
                print(json.dumps(results[-1]), flush=True)
    finally:
        server.kill()
    summary = {
        "size": args.size,
        "workers": args.workers,
        "batch": args.batch,
        "profile": profile.describe(),
        "requests_per_s_limit": args.requests_per_s,
        "rounds": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
