"""The memory budget per consumer (``memory_budget_bytes``): the pool and read-ahead shrink to fit it,
from metadata alone, so coverage, determinism and resume are those of a smaller pool; what a
consumer holds stays under it, with real DataLoader workers and in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.plan.budget import EXTRA_EPISODES, EpisodeTooLarge, MemoryNeeds, fit_pool
from lerobot_shards.synth import synth_dataset
from waits import HANG_GUARD_S

BATCH = 4
EPISODES = 16


def _needs(sizes: list[int], fixed: int = 0) -> MemoryNeeds:
    return MemoryNeeds(
        episode_bytes=sizes,
        frame_bytes=[100, 100],
        sample_bytes=200,
        lookahead_samples=4,
        decoder_cap=None,
        fixed_bytes=fixed,
    )


def test_the_read_ahead_shrinks_first_then_the_pool_never_below_one() -> None:
    needs = _needs([1000] * 40)
    whole = needs.cost(16, 16)
    assert fit_pool(needs, whole, 16, 16).pool == 16 and not fit_pool(needs, whole, 16, 16).shrunk
    plan = fit_pool(needs, whole - 1, 16, 16)
    assert (plan.pool, plan.prefetch) == (16, 15) and plan.estimate <= whole - 1
    plan = fit_pool(needs, needs.cost(16, 1) - 1, 16, 16)  # the read-ahead alone cannot make it fit
    assert (plan.pool, plan.prefetch) == (15, 1) and plan.estimate <= needs.cost(16, 1) - 1
    assert fit_pool(needs, needs.cost(1, 1), 16, 16).pool == 1
    with pytest.raises(EpisodeTooLarge):
        fit_pool(needs, needs.cost(1, 1) - 1, 16, 16)


def test_the_largest_episodes_are_counted() -> None:
    needs = _needs([10, 5000, 20, 30, 4000, 40], fixed=7)
    # pool 1 + read-ahead 1 + the extra ones: the largest episodes that many times
    held = sorted([10, 5000, 20, 30, 4000, 40], reverse=True)[: 2 + EXTRA_EPISODES]
    assert needs.cost(1, 1) == 7 + sum(held) + 2 * 8 * 100 + 2 * 4 * 200


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 two-camera episodes of 40-60 frames, one per shard (their clips outweigh tar headers)."""
    base = tmp_path_factory.mktemp("budget")
    raw = synth_dataset(
        base / "raw", num_episodes=EPISODES, height=48, width=64, length_range=(40, 60), texture="realistic"
    )
    convert_dataset(raw, base / "shards", ConvertOptions(episodes_per_shard=1))
    return base / "shards"


def _dataset(root: Path, **options: Any) -> EpisodePoolDataset:
    options.setdefault("seed", 5)
    return EpisodePoolDataset(str(root), **options)


def _pool_budget(root: Path, pool: int) -> int:
    """The smallest budget that holds a pool of ``pool`` episodes with one read ahead."""
    return _dataset(root).memory.needs.cost(pool, 1)


def _batches(ds: EpisodePoolDataset, num_workers: int) -> list[list[tuple[int, int]]]:
    loader = DataLoader(ds, batch_size=BATCH, num_workers=num_workers, multiprocessing_context="fork")
    return [list(zip(b["episode_index"].tolist(), b["frame_index"].tolist())) for b in loader]


def test_a_budget_shrinks_the_pool_and_what_a_worker_holds_stays_under_it(shards: Path) -> None:
    free = _dataset(shards)
    assert (free.memory.pool, free.epoch_order.pool_size) == (16, 16)  # the default budget is GBs here
    budget = _pool_budget(shards, 2)
    ds = _dataset(shards, memory_budget_bytes=budget)
    assert (ds.memory.pool, ds.memory.prefetch, ds.epoch_order.pool_size, ds.read.prefetch_episodes) == (2, 1, 2, 1)
    assert ds.memory.estimate <= budget
    got = [k for b in _batches(ds, 2) for k in b]
    assert sorted(got) == sorted((e, f) for s in ds.shards for e, n in zip(s.episodes, s.lengths) for f in range(n))
    held = ds.stats()["total"]["resident_bytes_peak"]
    # the largest episodes' real bytes, as many as the plan lets a consumer hold at once
    sizes = sorted((p.stat().st_size for p in (shards / "shards").glob("*.tar")), reverse=True)
    assert 0 < held <= sum(sizes[: 2 + 1 + EXTRA_EPISODES]) <= budget
    # without the budget each worker reads its 8 episodes ahead: more than the budget lets it hold
    assert sorted(k for b in _batches(free, 2) for k in b) == sorted(got)
    assert free.stats()["total"]["resident_bytes_peak"] > sum(sizes[: 2 + 1 + EXTRA_EPISODES])


def test_the_pool_is_a_function_of_metadata_so_the_order_repeats_and_resumes(shards: Path) -> None:
    budget = _pool_budget(shards, 2)
    whole = _batches(_dataset(shards, memory_budget_bytes=budget), 2)
    saved = _dataset(shards, memory_budget_bytes=budget).state_dict(batches_consumed=5, batch_size=BATCH)
    assert saved["episode_pool_size"] == 2
    resumed = _dataset(shards, memory_budget_bytes=budget)
    resumed.load_state_dict(saved)
    assert _batches(resumed, 2) == whole[5:]
    # the pool size it gives is what the state records: the same pool given as such resumes too
    same = _dataset(shards, episode_pool_size=2, prefetch_episodes=1)
    same.load_state_dict(saved)
    assert _batches(same, 2) == whole[5:]
    with pytest.raises(ValueError, match="episode_pool_size.*memory_budget_bytes"):
        _dataset(shards).load_state_dict(saved)


def test_one_episode_over_the_budget_is_named(shards: Path) -> None:
    # at 1080p each decoder and each sample decoded ahead alone outgrow 1 MiB
    with pytest.raises(ValueError, match=r"episode \d+ \(\d+ frames.*memory_budget_bytes=1048576 \(1 MiB"):
        _dataset(shards, memory_budget_bytes=1 << 20, resize=(1080, 1920))
    with pytest.raises(ValueError, match="memory_budget_bytes must be"):
        _dataset(shards, memory_budget_bytes=1000)


# A consumer's process under the budget, measured: its peak RSS (the kernel's high-water mark,
# VmHWM, reset once the dataset is built and one sample decoded: libraries loaded, allocator arenas
# made; no sampling, no timing) above its RSS then stays within the budget plus this much: what the
# budget does not count (the Python objects of samples in flight, allocator slack). ru_maxrss would
# not do: a child keeps its parent's high-water mark across exec.
OVERHEAD_BYTES = 32 << 20

CONSUMER = """
import json, sys
import psutil, torch
from lerobot_shards.loader import EpisodePoolDataset
budget = None if sys.argv[2] == "none" else int(sys.argv[2])
ds = EpisodePoolDataset(sys.argv[1], seed=1, memory_budget_bytes=budget, image_dtype=torch.uint8, decode_threads=1)
warm = EpisodePoolDataset(sys.argv[1], seed=1, episodes=[0], image_dtype=torch.uint8, decode_threads=1)
next(iter(warm))
samples = iter(ds)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from here
base = psutil.Process().memory_info().rss
n = sum(1 for _, _ in zip(range(int(sys.argv[3])), samples))
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"samples": n, "base": base, "peak": peak, "pool": ds.memory.pool,
                  "held": ds.stats()["total"]["resident_bytes_peak"]}))
"""


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 episodes of 2 cameras, ~8 MB each: all of them resident is well over a budget of one."""
    base = tmp_path_factory.mktemp("heavy")
    raw = synth_dataset(
        base / "raw",
        num_episodes=8,
        height=240,
        width=320,
        length_range=(150, 150),
        texture="realistic",
        crf=5,
    )
    convert_dataset(raw, base / "shards", ConvertOptions(episodes_per_shard=1))
    return base / "shards"


def _consume(root: Path, budget: int | None, samples: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", CONSUMER, str(root), "none" if budget is None else str(budget), str(samples)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_a_consumer_process_stays_within_its_budget(heavy: Path) -> None:
    sizes = sorted((p.stat().st_size for p in (heavy / "shards").glob("*.tar")), reverse=True)
    budget = _dataset(heavy, image_dtype=torch.uint8, decode_threads=1).memory.needs.cost(1, 1)
    run = _consume(heavy, budget, 3 * 150)  # a pool of one: three episodes come and go
    assert run["pool"] == 1 and run["samples"] == 3 * 150
    assert run["peak"] - run["base"] <= budget + OVERHEAD_BYTES, run
    # the same consumer without a budget holds every episode once all are admitted (8 x 8 samples,
    # the sampler's order): past the bound, so the test can fail
    free = _consume(heavy, None, 200)
    assert free["held"] >= sum(sizes) * 0.9
    assert free["peak"] - free["base"] > budget + OVERHEAD_BYTES, (free, budget)


def test_a_mixture_shares_its_budget_among_its_sources(shards: Path, tmp_path: Path) -> None:
    from lerobot_shards.loader import MixtureDataset

    spec = tmp_path / "mix.yaml"
    spec.write_text(
        f"sources:\n  - {{source: {shards}, name: a, weight: 1}}\n  - {{source: {shards}, name: b, weight: 1}}\n"
    )
    budget = 2 * _pool_budget(shards, 2)
    mixed = MixtureDataset(spec, seed=5, memory_budget_bytes=budget)
    assert [ds.memory.budget for ds in mixed.sources] == [budget // 2] * 2
    assert [ds.epoch_order.pool_size for ds in mixed.sources] == [2, 2]
