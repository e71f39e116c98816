"""Elastic resume's start-up cost on large metadata: seconds per new consumer at 1M, 10M and 100M frames.

    .venv/bin/python benchmarks/loader/bench_elastic.py                        # 1M, 10M, 100M frames
    .venv/bin/python benchmarks/loader/bench_elastic.py --frames 1000000 --tag quick

A resume under another world size or worker count (``loader/plan/elastic.py``) finds where every
old consumer stopped (``emitted_frames``: each one's plan, from one layout, and its sampler's state
at the cut, ``plan/progress.py``), then lays the rest out over the new consumers (``plan_elastic``).
Every new consumer does this at its ``__iter__``, on tables alone, before its first sample, so its
cost is start-up time and memory of each DataLoader worker. This measures both on synthetic
metadata (no video: ``plan/`` is pure): episodes of ``--length-range`` frames in shards of
``--episodes-per-shard``, an interrupted run of ``--from-layout`` (world size x workers) stopped
``--fraction`` of the way through its epoch, resumed as ``--to-layout``. The former way, every old
consumer planned alone and its ``PoolSampler`` fast-forwarded sample by sample (the tests' oracle),
runs beside it up to ``--replay-up-to`` frames (interleaved: replay, summary, per size). numba's
compile is excluded (done once before, and cached on disk after the first run on a machine);
its cached load is reported. Peak memory of Python objects is measured in a second pass under
``tracemalloc``. Writes ``results/elastic[-TAG].{json,md}`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_shards.loader.plan import elastic, progress
from lerobot_shards.loader.plan.elastic import InterruptedEpoch, Origin, emitted_frames, plan_elastic
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


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and this process's CPU seconds (the machine is shared: CPU is the steadier)."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def _peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of Python allocations while ``fn`` runs (its result included)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(args: argparse.Namespace, frames: int) -> dict[str, Any]:
    """One dataset size: one new consumer's whole plan (``plan_elastic``), by summaries and, up to
    ``--replay-up-to`` frames, by replay; the emitted frames of both compared."""
    mean = sum(args.length_range) / 2
    shards = make_shards(round(frames / mean), args.length_range, args.episodes_per_shard, args.seed)
    total = sum(s.frames for s in shards)
    options = PlanOptions(shuffle=True, equal_samples_per_rank=False)
    world, workers = args.from_layout
    rank_samples = sum(
        plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, world, 0, workers), options=options).rank_samples
    )
    origin = Origin(world, workers, int(args.fraction * rank_samples) // args.batch_size, args.batch_size)
    interrupted = InterruptedEpoch(
        tuple(shards), seed=0, epoch=0, options=options, pool_size=args.pool_size, origin=origin, drop_last=False
    )
    new_world, new_workers = args.to_layout
    consumer = Consumer(0, new_world, 0, new_workers)

    def plan() -> Any:
        elastic._emitted_frames_cached.cache_clear()  # a new consumer's process: nothing planned yet
        return plan_elastic(interrupted, consumer=consumer)

    def replayed() -> Any:
        kernel, progress._kernel = progress._kernel, lambda: None  # PoolSampler.skip, sample by sample
        try:
            return plan()
        finally:
            progress._kernel = kernel

    row: dict[str, Any] = {"episodes": sum(len(s.episodes) for s in shards), "shards": len(shards), "frames": total}
    if total <= args.replay_up_to:
        slow, replay_s, replay_cpu = _timed(replayed)
        row.update(replay_s=round(replay_s, 2), replay_cpu_s=round(replay_cpu, 2))
    result, summary_s, summary_cpu = _timed(plan)
    if total <= args.replay_up_to:
        assert result == slow, "the summaries and the replay disagree"
    emitted = emitted_frames(interrupted)
    lengths = {e: n for s in shards for e, n in zip(s.episodes, s.lengths)}
    row.update(
        emitted_frames=sum(lengths[e] if v is None else len(v) for e, v in emitted.items()),  # None: whole
        batches_consumed_per_rank=origin.batches_consumed,
        seconds_per_consumer=round(summary_s, 2),
        cpu_seconds_per_consumer=round(summary_cpu, 2),
        cpu_ns_per_frame=round(summary_cpu / total * 1e9, 1),
        peak_mb=round(_peak_bytes(plan) / 2**20, 1),
        consumer_samples=result.plan.num_samples,
    )
    if "replay_s" in row:
        row["cpu_speedup"] = round(replay_cpu / summary_cpu, 1)
    return row


def measure_mixture(args: argparse.Namespace, frames: int) -> dict[str, Any]:
    """``--mixture``: the same for a mixture of three sources of ``frames / 3`` frames each, the first
    read twice (``repeat: 2``, so its old consumers stand in their second pass): one new consumer's
    start (``MixtureOrder._start_elastic``: each old consumer's schedule up to the cut, then where it
    stood in each source, by summaries, or by replay up to ``--replay-up-to``)."""
    from lerobot_shards.loader.mix import order as mix_order
    from lerobot_shards.loader.mix.order import MixtureOrder
    from lerobot_shards.loader.plan.order import EpochOrder

    mean = sum(args.length_range) / 2
    world, workers = args.from_layout
    new_world, new_workers = args.to_layout
    orders = []
    for d in range(3):
        shards = make_shards(round(frames / 3 / mean), args.length_range, args.episodes_per_shard, args.seed + d)
        orders.append(EpochOrder(tuple(shards), f"source-{d}", 0, True, args.pool_size, False, False, 0, new_world))
    sizes = [sum(s.frames for s in o.shards) for o in orders]
    mix = MixtureOrder(tuple(orders), (2 * sizes[0], sizes[1], sizes[2]), ("a", "b", "c"))
    rank_samples = sum(mix.rank_counts(0, 0, world, workers))
    origin = Origin(world, workers, int(args.fraction * rank_samples) // args.batch_size, args.batch_size)

    def start() -> Any:
        mix_order._elastic_cut.cache_clear()  # a new rank's process: nothing found yet
        got = mix._start_elastic(0, origin, (), 0, new_workers)
        return got.schedule, [[(p.plan, p.skip) for p in parts] for parts in got.parts]

    def replayed() -> Any:
        kernel, progress._kernel = progress._kernel, lambda: None  # PoolSampler.skip, sample by sample
        try:
            return start()
        finally:
            progress._kernel = kernel

    row: dict[str, Any] = {
        "frames": sum(sizes),
        "samples": sum(mix.counts),
        "episodes": sum(len(s.episodes) for o in orders for s in o.shards),
    }
    if sum(mix.counts) <= args.replay_up_to:
        slow, replay_s, replay_cpu = _timed(replayed)
        row.update(replay_s=round(replay_s, 2), replay_cpu_s=round(replay_cpu, 2))
    result, summary_s, summary_cpu = _timed(start)
    if "replay_s" in row:
        assert np.array_equal(result[0], slow[0]) and result[1] == slow[1], "the summaries and the replay disagree"
        row["cpu_speedup"] = round(replay_cpu / summary_cpu, 1)
    row.update(
        batches_consumed_per_rank=origin.batches_consumed,
        seconds_per_consumer=round(summary_s, 2),
        cpu_seconds_per_consumer=round(summary_cpu, 2),
        cpu_ns_per_sample=round(summary_cpu / sum(mix.counts) * 1e9, 1),
        peak_mb=round(_peak_bytes(start) / 2**20, 1),
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", default="1000000,10000000,100000000", help="dataset sizes, in frames")
    ap.add_argument("--length-range", type=lambda t: tuple(int(x) for x in t.split(",")), default=(200, 400))
    ap.add_argument("--episodes-per-shard", type=int, default=10)
    ap.add_argument("--from-layout", type=_layout, default=(8, 4), help="interrupted run: WORLDxWORKERS")
    ap.add_argument("--to-layout", type=_layout, default=(4, 2), help="resumed run: WORLDxWORKERS")
    ap.add_argument("--fraction", type=float, default=0.5, help="how far through the epoch the run stopped")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--replay-up-to", type=int, default=10_000_000, help="frames up to which the replay runs too")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="results/elastic-TAG.* instead of results/elastic.*")
    ap.add_argument("--mixture", action="store_true", help="a mixture of three sources (results/elastic-mixture.*)")
    args = ap.parse_args()
    if args.mixture:
        return main_mixture(args)

    load_start = time.perf_counter()
    assert progress._kernel() is not None, "numba is not installed: the summaries would replay"
    progress.consumer_progress([2, 3], 2, np.random.default_rng(0), 1)  # compiled, or loaded from numba's cache
    kernel_s = time.perf_counter() - load_start
    rows = []
    for frames in (int(x) for x in args.frames.split(",")):
        rows.append(measure(args, frames))
        print(json.dumps(rows[-1]), flush=True)
    (fw, fn), (tw, tn) = args.from_layout, args.to_layout
    load = os.getloadavg()
    lines = [
        f"# Elastic resume: seconds per new consumer ({fw}x{fn} -> {tw}x{tn} consumers, stopped at "
        f"{args.fraction:.0%} of the epoch, batch {args.batch_size}, pool {args.pool_size}, episodes of "
        f"{args.length_range[0]}-{args.length_range[1]} frames, {args.episodes_per_shard} per shard; "
        f"{platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.1f} at the end: shared machine)",
        "",
        f"numba's compiled loop loaded in {kernel_s:.2f} s (once per process; the first run on a machine compiles it).",
        "",
        "| frames | episodes | emitted | per consumer: wall s | CPU s | CPU ns per frame | replay: wall s | CPU s "
        "| CPU speedup | peak MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['frames']:,} | {r['episodes']:,} | {r['emitted_frames']:,} | {r['seconds_per_consumer']:.2f} | "
        f"{r['cpu_seconds_per_consumer']:.2f} | {r['cpu_ns_per_frame']:.0f} | {r.get('replay_s', '-')} | "
        f"{r.get('replay_cpu_s', '-')} | {r.get('cpu_speedup', '-')} | {r['peak_mb']:.1f} |"
        for r in rows
    ]
    name = f"elastic-{args.tag}" if args.tag else "elastic"
    RESULTS.mkdir(parents=True, exist_ok=True)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()}
    meta = {"kernel_load_s": round(kernel_s, 2), "load_average": [round(x, 1) for x in load]}
    (RESULTS / f"{name}.json").write_text(json.dumps({"settings": settings, **meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main_mixture(args: argparse.Namespace) -> None:
    """``--mixture``: ``measure_mixture`` per size, written to ``results/elastic-mixture[-TAG].*``."""
    assert progress._kernel() is not None, "numba is not installed: the summaries would replay"
    progress.consumer_progress([2, 3], 2, np.random.default_rng(0), 1)  # compiled, or loaded from numba's cache
    rows = []
    for frames in (int(x) for x in args.frames.split(",")):
        rows.append(measure_mixture(args, frames))
        print(json.dumps(rows[-1]), flush=True)
    (fw, fn), (tw, tn) = args.from_layout, args.to_layout
    load = os.getloadavg()
    lines = [
        f"# Elastic resume of a mixture: seconds per new consumer ({fw}x{fn} -> {tw}x{tn} consumers, stopped at "
        f"{args.fraction:.0%} of the epoch, batch {args.batch_size}, pool {args.pool_size}; three sources of "
        f"a third of the frames each, the first with repeat 2; episodes of {args.length_range[0]}-"
        f"{args.length_range[1]} frames; {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} at the end: shared machine, figures under load)",
        "",
        "| frames | samples per epoch | per consumer: wall s | CPU s | CPU ns per sample | replay: wall s | CPU s "
        "| CPU speedup | peak MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['frames']:,} | {r['samples']:,} | {r['seconds_per_consumer']:.2f} | {r['cpu_seconds_per_consumer']:.2f} "
        f"| {r['cpu_ns_per_sample']:.0f} | {r.get('replay_s', '-')} | {r.get('replay_cpu_s', '-')} | "
        f"{r.get('cpu_speedup', '-')} | {r['peak_mb']:.1f} |"
        for r in rows
    ]
    name = f"elastic-mixture-{args.tag}" if args.tag else "elastic-mixture"
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()}
    record = {"settings": settings, "load_average": [round(x, 1) for x in load], "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
