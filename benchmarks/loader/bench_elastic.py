"""Elastic resume's replay cost on large metadata: seconds and peak memory per frame.

    .venv/bin/python benchmarks/loader/bench_elastic.py                       # 1k, 10k, 100k episodes
    .venv/bin/python benchmarks/loader/bench_elastic.py --episodes 1000 --tag quick

A resume under another world size or worker count (``loader/plan/elastic.py``) recomputes the frames
the interrupted run emitted by replaying every old consumer's sampler (``emitted_frames``), then
lays the rest out over the new consumers (``plan_elastic``). Every new consumer does this at its
``__iter__``, on tables alone, before its first sample, so its cost is start-up time and memory of
each DataLoader worker. This measures both on synthetic metadata (no video): episodes of
``--length-range`` frames in shards of ``--episodes-per-shard``, an interrupted run of
``--from-layout`` (world size x workers) stopped ``--fraction`` of the way through its epoch,
resumed as ``--to-layout``. Time is measured without tracing; peak memory of Python objects in a
second pass under ``tracemalloc`` (which slows that pass down). Writes
``results/elastic[-TAG].{json,md}`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_shards.loader.plan.elastic import Origin, emitted_frames, plan_elastic
from lerobot_shards.loader.plan.partition import Consumer, PlanOptions, ShardSpec, plan_consumer

RESULTS = Path(__file__).resolve().parent / "results"


def make_shards(episodes: int, length_range: tuple[int, int], per_shard: int, seed: int) -> list[ShardSpec]:
    """The tables of a dataset: episode lengths drawn uniformly from ``length_range``, in shards."""
    lengths = np.random.default_rng(seed).integers(length_range[0], length_range[1] + 1, episodes).tolist()
    return [
        ShardSpec(i, tuple(range(s, min(s + per_shard, episodes))), tuple(lengths[s : s + per_shard]))
        for i, s in enumerate(range(0, episodes, per_shard))
    ]


def _layout(text: str) -> tuple[int, int]:
    world, workers = (int(x) for x in text.lower().split("x"))
    return world, workers


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of Python allocations while ``fn`` runs (its result included)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(args: argparse.Namespace, episodes: int) -> dict[str, Any]:
    """One dataset size: replay (``emitted_frames``) and one new consumer's whole plan (``plan_elastic``)."""
    shards = make_shards(episodes, args.length_range, args.episodes_per_shard, args.seed)
    frames = sum(s.frames for s in shards)
    options = PlanOptions(shuffle=True, equal_samples_per_rank=False)
    world, workers = args.from_layout
    rank_samples = sum(
        plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, world, 0, workers), options=options).rank_samples
    )
    origin = Origin(world, workers, int(args.fraction * rank_samples) // args.batch_size, args.batch_size)
    common = dict(seed=0, epoch=0, options=options, pool_size=args.pool_size, origin=origin, drop_last=False)
    new_world, new_workers = args.to_layout
    consumer = Consumer(0, new_world, 0, new_workers)

    def replay() -> dict[int, np.ndarray | None]:
        return emitted_frames(shards, **common)

    def plan() -> Any:
        return plan_elastic(shards, consumer=consumer, **common)

    emitted, replay_s = _timed(replay)
    elastic, plan_s = _timed(plan)
    replay_peak, plan_peak = _peak_bytes(replay), _peak_bytes(plan)
    lengths = {e: n for s in shards for e, n in zip(s.episodes, s.lengths)}
    done = sum(lengths[e] if v is None else len(v) for e, v in emitted.items())  # None: emitted whole
    return {
        "episodes": episodes,
        "shards": len(shards),
        "frames": frames,
        "emitted_frames": done,
        "batches_consumed_per_rank": origin.batches_consumed,
        "replay_s": round(replay_s, 3),
        "plan_elastic_s": round(plan_s, 3),
        "plan_elastic_us_per_frame": round(plan_s / frames * 1e6, 3),
        "replay_peak_mb": round(replay_peak / 2**20, 1),
        "plan_elastic_peak_mb": round(plan_peak / 2**20, 1),
        "plan_elastic_peak_bytes_per_frame": round(plan_peak / frames, 1),
        "consumer_samples": elastic.plan.num_samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", default="1000,10000,100000", help="dataset sizes, in episodes")
    ap.add_argument("--length-range", type=lambda t: tuple(int(x) for x in t.split(",")), default=(10, 50))
    ap.add_argument("--episodes-per-shard", type=int, default=50)
    ap.add_argument("--from-layout", type=_layout, default=(8, 4), help="interrupted run: WORLDxWORKERS")
    ap.add_argument("--to-layout", type=_layout, default=(4, 2), help="resumed run: WORLDxWORKERS")
    ap.add_argument("--fraction", type=float, default=0.5, help="how far through the epoch the run stopped")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="results/elastic-TAG.* instead of results/elastic.*")
    args = ap.parse_args()

    rows = []
    for episodes in (int(x) for x in args.episodes.split(",")):
        rows.append(measure(args, episodes))
        print(json.dumps(rows[-1]), flush=True)
    (fw, fn), (tw, tn) = args.from_layout, args.to_layout
    lines = [
        f"# Elastic resume: replay cost ({fw}x{fn} -> {tw}x{tn} consumers, stopped at {args.fraction:.0%} of the "
        f"epoch, batch {args.batch_size}, pool {args.pool_size}, episodes of {args.length_range[0]}-"
        f"{args.length_range[1]} frames, {args.episodes_per_shard} per shard; {platform.machine()}, shared machine)",
        "",
        "| episodes | frames | emitted | replay s | plan_elastic s | us per frame | peak MB | bytes per frame |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['episodes']:,} | {r['frames']:,} | {r['emitted_frames']:,} | {r['replay_s']:.2f} | "
        f"{r['plan_elastic_s']:.2f} | {r['plan_elastic_us_per_frame']:.2f} | {r['plan_elastic_peak_mb']:.1f} | "
        f"{r['plan_elastic_peak_bytes_per_frame']:.0f} |"
        for r in rows
    ]
    name = f"elastic-{args.tag}" if args.tag else "elastic"
    RESULTS.mkdir(parents=True, exist_ok=True)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()}
    (RESULTS / f"{name}.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
