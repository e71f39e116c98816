"""Elastic resume: an epoch interrupted under one (ranks x workers) layout finishes under another.

Real DataLoader worker processes on a synthetic dataset; the tables-only tests leave the camera
out (no video), the end-to-end one reads every frame's identity back from its pixels.
"""

from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import random
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.plan import elastic, progress
from lerobot_shards.loader.plan.elastic import InterruptedEpoch, Origin, SubsetSampler, emitted_frames, plan_elastic
from lerobot_shards.loader.plan.partition import Consumer, PlanOptions, ShardSpec, plan_consumer
from lerobot_shards.loader.plan.resume import samples_to_skip
from lerobot_shards.loader.plan.sampling import FILL_EVERY, UNIFORM_BLOCK, PoolSampler, consumer_rng, keyed_rng
from lerobot_shards.synth import read_identity, synth_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")

CAM = "observation.images.front"
BATCH = 3


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """6 episodes in 3 virtual shards, one camera with identity painted."""
    return synth_dataset(
        tmp_path_factory.mktemp("elastic") / "ds",
        num_episodes=6,
        cameras=(CAM,),
        length_range=(8, 20),
        episodes_per_video_file=3,
        episodes_per_data_file=3,
        seed=5,
    )


def _dataset(root: Path, rank: int, world_size: int, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("cameras", [])
    return EpisodePoolDataset(
        str(root),
        episodes_per_shard=2,
        episode_pool_size=2,
        seed=4,
        rank=rank,
        world_size=world_size,
        equal_samples_per_rank=False,
        **kwargs,
    )


def _batches(ds: EpisodePoolDataset, num_workers: int, check_pixels: bool = False) -> list[list[tuple[int, int]]]:
    out = []
    for batch in DataLoader(ds, batch_size=BATCH, num_workers=num_workers):
        keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))
        if check_pixels:
            assert [read_identity(image) for image in batch[CAM]] == keys
        out.append(keys)
    return out


def _all_frames(root: Path) -> collections.Counter:
    ds = _dataset(root, 0, 1)
    return collections.Counter((e, f) for s in ds.shards for e, n in zip(s.episodes, s.lengths) for f in range(n))


def _interrupted(root: Path, cut: int, **kwargs) -> tuple[collections.Counter, dict[str, int]]:
    """Frames a (2 ranks x 2 workers) run emitted in its first ``cut`` batches per rank, and its state."""
    seen: collections.Counter = collections.Counter()
    for rank in range(2):
        ds = _dataset(root, rank, 2, **kwargs)
        batches = _batches(ds, 2)
        assert cut < len(batches)  # interrupted mid-epoch
        for batch in batches[:cut]:
            seen.update(batch)
        state = ds.state_dict(batches_consumed=cut, batch_size=BATCH)
    return seen, state


def _resumed(root: Path, state: dict[str, int], world_size: int, num_workers: int, **kwargs) -> list:
    """Every rank's batches of the resumed epoch under the new layout."""
    out = []
    for rank in range(world_size):
        ds = _dataset(root, rank, world_size, **kwargs)
        ds.load_state_dict(state)
        out.append(_batches(ds, num_workers, check_pixels=CAM in kwargs.get("cameras", [])))
    return out


@pytest.mark.parametrize("layout", [(1, 3), (3, 1)])
@pytest.mark.parametrize("cut", [1, 4, 8])
def test_elastic_resume_covers_the_epoch_exactly_once(raw: Path, layout: tuple[int, int], cut: int) -> None:
    before, state = _interrupted(raw, cut)
    after = collections.Counter(k for rank in _resumed(raw, state, *layout) for b in rank for k in b)
    assert before + after == _all_frames(raw)  # nothing lost, nothing twice
    assert all(n == 1 for n in (before + after).values())


def test_an_elastic_resume_is_summarised_once_per_rank_not_per_worker(raw: Path, monkeypatch) -> None:
    """Resumed under another world size with 3 workers: where the old consumers stopped is found
    once, in the rank's process at ``load_state_dict``, before the DataLoader forks; the workers
    inherit it (one call in all, counted across the processes), and the epoch is covered exactly
    once as before."""
    calls = multiprocessing.Value("i", 0)

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        with calls.get_lock():
            calls.value += 1
        return emitted_frames(*args, **kwargs)

    monkeypatch.setattr(elastic, "_emitted_frames_cached", functools.lru_cache(maxsize=1)(counted))
    before, state = _interrupted(raw, 4)
    assert calls.value == 0
    after = collections.Counter(k for rank in _resumed(raw, state, 1, 3) for b in rank for k in b)
    assert calls.value == 1
    assert before + after == _all_frames(raw)


def test_elastic_resume_is_deterministic(raw: Path) -> None:
    _, state = _interrupted(raw, 3)
    assert _resumed(raw, state, 1, 3) == _resumed(raw, state, 1, 3)


def test_elastic_resume_end_to_end_reads_the_right_pixels(raw: Path) -> None:
    before, state = _interrupted(raw, 4)
    after = collections.Counter(k for rank in _resumed(raw, state, 3, 1, cameras=[CAM]) for b in rank for k in b)
    assert before + after == _all_frames(raw)


def test_second_resume_inside_an_elastic_epoch(raw: Path) -> None:
    """A state saved in an elastic epoch resumes under that run's layout, and refuses any other."""
    before, state = _interrupted(raw, 3)
    ds = _dataset(raw, 0, 1)
    ds.load_state_dict(state)
    elastic = _batches(ds, 3)
    state2 = ds.state_dict(batches_consumed=state["batches_consumed"] + 4, batch_size=BATCH)
    assert state2["elastic_world_size"] == 2 and state2["elastic_num_workers"] == 2
    again = _dataset(raw, 0, 1)
    again.load_state_dict(state2)
    assert _batches(again, 3) == elastic[4:]
    assert before + collections.Counter(k for b in elastic for k in b) == _all_frames(raw)
    other = _dataset(raw, 0, 1)
    other.load_state_dict(state2)
    with pytest.raises(Exception, match=r"resume this epoch with the saving run's layout"):
        _batches(other, 2)


def test_equal_mode_gives_every_new_consumer_the_same_count() -> None:
    shards = [ShardSpec(i, (2 * i, 2 * i + 1), (7 + i, 11 - i)) for i in range(4)]
    options = PlanOptions(equal_samples_per_rank=True)
    origin = Origin(world_size=2, num_workers=2, batches_consumed=3, batch_size=2)
    interrupted = InterruptedEpoch(
        tuple(shards), seed=1, epoch=0, options=options, pool_size=2, origin=origin, drop_last=False
    )
    plans = [plan_elastic(interrupted, consumer=Consumer(rank, 3, 0, 1)).plan for rank in range(3)]
    remaining = 4 * 18 - 2 * 3 * 2  # each of the 2 old ranks consumed 3 batches of 2
    assert [p.num_samples for p in plans] == [remaining // 3] * 3
    assert sum(sum(p.lengths) for p in plans) == remaining


def _replayed(interrupted: InterruptedEpoch) -> dict[int, set[int]]:
    """The emitted frames the slow way: every old consumer's emissions, one by one."""
    shards, seed, epoch, options = interrupted.shards, interrupted.seed, interrupted.epoch, interrupted.options
    origin = interrupted.origin
    seen: dict[int, set[int]] = {}
    workers = max(1, origin.num_workers)
    for rank in range(origin.world_size):
        plans = [
            plan_consumer(
                shards, seed=seed, epoch=epoch, consumer=Consumer(rank, origin.world_size, w, workers), options=options
            )
            for w in range(workers)
        ]
        for w, plan in enumerate(plans):
            skip = samples_to_skip(origin.segments(), plans[0].rank_samples, w, interrupted.drop_last)
            sampler = PoolSampler(
                plan.lengths,
                interrupted.pool_size,
                consumer_rng(seed, epoch, rank, w),
                shuffle=options.shuffle,
                num_samples=plan.num_samples,
            )
            for emission in itertools.islice(sampler, skip):
                seen.setdefault(plan.episodes[emission.position][1], set()).add(emission.frame)
    return seen


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("equal", [True, False])
def test_emitted_frames_read_off_the_state_equal_a_full_replay(shuffle: bool, equal: bool) -> None:
    rng, checked = random.Random(7), 0
    for case in range(40):
        shards = [
            ShardSpec(i, tuple(range(3 * i, 3 * i + 3)), tuple(rng.randint(1, 9) for _ in range(3)))
            for i in range(rng.randint(1, 5))
        ]
        world, workers, batch = rng.randint(1, 3), rng.randint(0, 3), rng.randint(1, 4)
        options = PlanOptions(shuffle=shuffle, equal_samples_per_rank=equal)
        try:
            plan_consumer(shards, seed=case, epoch=0, consumer=Consumer(0, world, 0, max(1, workers)), options=options)
        except ValueError:  # equal-count mode refuses consumers without frames
            continue
        batches = min(  # the epoch's batches on its shortest rank: any cut up to it
            sum(
                -(-n // batch)
                for n in plan_consumer(shards, seed=case, epoch=0, consumer=c, options=options).rank_samples
            )
            for c in (Consumer(r, world, 0, max(1, workers)) for r in range(world))
        )
        origin = Origin(world, workers, rng.randint(0, batches), batch)
        interrupted = InterruptedEpoch(
            tuple(shards),
            seed=case,
            epoch=0,
            options=options,
            pool_size=rng.randint(1, 4),
            origin=origin,
            drop_last=False,
        )
        lengths = {e: n for s in shards for e, n in zip(s.episodes, s.lengths)}
        fast = emitted_frames(interrupted)
        as_sets = {e: set(range(lengths[e])) if f is None else set(f.tolist()) for e, f in fast.items()}
        slow = _replayed(interrupted)
        assert {e: f for e, f in as_sets.items() if f} == slow, (case, origin)
        checked += 1
    assert checked >= 20


def _progress_cases(count: int):
    """Random plans (lengths, pool size, fill step) and cuts inside their first pass."""
    rng = random.Random(11)
    for case in range(count):
        lengths = [rng.randint(1, 14) for _ in range(rng.randint(1, 30))]
        if sum(lengths) > 1:
            yield case, lengths, rng.randint(1, 7), rng.choice([0, 1, 3, FILL_EVERY]), rng.randint(1, sum(lengths) - 1)


def _sampler_progress(lengths, pool_size, seed, skip, fill_every=FILL_EVERY, shuffle=True):
    sampler = PoolSampler(
        lengths, pool_size, keyed_rng(seed), fill_every=fill_every, shuffle=shuffle, num_samples=max(skip, 1)
    )
    sampler.skip(skip)
    return sampler.progress()


def _same(a, b) -> None:
    assert a[0] == b[0] and a[1].keys() == b[1].keys()
    assert all(np.array_equal(a[1][k], b[1][k]) for k in a[1])


def test_the_compiled_loop_reaches_the_samplers_state() -> None:
    """``progress._progress``, compiled and as plain Python, ends where ``PoolSampler.skip`` does: the
    same admitted count, resident episodes and frames emitted of each, in order."""
    kernel = progress._kernel()
    assert kernel is not None  # numba is a dependency: the fast path is the one that runs
    for case, lengths, pool_size, fill_every, skip in _progress_cases(150):
        reference = _sampler_progress(lengths, pool_size, case, skip, fill_every)
        for run in (kernel, progress._progress):
            admitted, position, remaining, emitted, orders = run(
                np.asarray(lengths, np.int64), pool_size, keyed_rng(case), skip, fill_every, UNIFORM_BLOCK
            )
            resident = {int(position[s]): orders[s][: emitted[s]] for s in range(pool_size) if remaining[s] > 0}
            _same((admitted, resident), reference)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_consumer_progress_equals_the_replay(monkeypatch, compiled: bool, shuffle: bool) -> None:
    """With numba and without (the sampler replayed), shuffled and in order."""
    if not compiled:
        monkeypatch.setattr(progress, "_kernel", lambda: None)
    for case, lengths, pool_size, _, skip in _progress_cases(60):
        got = progress.consumer_progress(lengths, pool_size, keyed_rng(case), skip, shuffle=shuffle)
        _same(got, _sampler_progress(lengths, pool_size, case, skip, shuffle=shuffle))
    assert progress.consumer_progress([3, 4], 2, keyed_rng(0), 0) == (0, {})
    with pytest.raises(ValueError, match="skip must be non-negative"):
        progress.consumer_progress([3, 4], 2, keyed_rng(0), -1)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_consumer_progress_past_a_pass_equals_the_replay(monkeypatch, compiled: bool, shuffle: bool) -> None:
    """A mixture's source reads further passes from the same generator: after any number of samples,
    a pass's end included, the summary is the sampler's own (its current pass)."""
    if not compiled:
        monkeypatch.setattr(progress, "_kernel", lambda: None)
    for case, lengths, pool_size, _, skip in _progress_cases(40):
        total = sum(lengths)
        for past in (skip + total, 2 * total, skip + 3 * total):
            got = progress.consumer_progress(lengths, pool_size, keyed_rng(case), past, shuffle=shuffle)
            _same(got, _sampler_progress(lengths, pool_size, case, past, shuffle=shuffle))


def _emitted_by_replay(interrupted: InterruptedEpoch, replay=None):
    """The elastic resume's former ``emitted_frames``, kept as the oracle: each old consumer planned
    on its own and its ``PoolSampler`` fast-forwarded emission by emission."""
    assert replay is None
    shards, seed, epoch, options = interrupted.shards, interrupted.seed, interrupted.epoch, interrupted.options
    origin, pool_size = interrupted.origin, interrupted.pool_size
    emitted: dict = {}
    workers = max(1, origin.num_workers)
    for rank in range(origin.world_size):
        for w in range(workers):
            consumer = Consumer(rank, origin.world_size, w, workers)
            plan = plan_consumer(shards, seed=seed, epoch=epoch, consumer=consumer, options=options)
            skip = samples_to_skip(origin.segments(), plan.rank_samples, w, interrupted.drop_last)
            rng = consumer_rng(seed, epoch, rank, w)
            sampler = PoolSampler(plan.lengths, pool_size, rng, shuffle=options.shuffle, num_samples=plan.num_samples)
            sampler.skip(skip)
            if skip >= sum(plan.lengths):
                emitted.update((e, None) for _, e in plan.episodes)
                continue
            admitted, partial = sampler.progress()
            for position in range(admitted):
                emitted[plan.episodes[position][1]] = partial.get(position)
    return emitted


@pytest.mark.parametrize("equal", [False, True])
def test_summary_resume_equals_replay_resume(monkeypatch, equal: bool) -> None:
    """Every new consumer's plan, frames and samples from the summaries equal those from replaying the
    old consumers, on random datasets, resizes up and down (ranks and workers), cuts and batch sizes."""
    rng, checked = random.Random(23), 0
    for case in range(40):
        shards = [
            ShardSpec(i, tuple(range(4 * i, 4 * i + 4)), tuple(rng.randint(1, 12) for _ in range(4)))
            for i in range(rng.randint(1, 6))
        ]
        old, new = (rng.randint(1, 4), rng.randint(0, 3)), (rng.randint(1, 4), rng.randint(0, 3))
        options = PlanOptions(shuffle=rng.random() < 0.8, equal_samples_per_rank=equal)
        batch, pool_size = rng.randint(1, 5), rng.randint(1, 4)
        try:
            batches = min(
                -(-n // batch)
                for c in (Consumer(r, old[0], 0, max(1, old[1])) for r in range(old[0]))
                for n in [sum(plan_consumer(shards, seed=case, epoch=0, consumer=c, options=options).rank_samples)]
            )
        except ValueError:  # equal-count mode refuses consumers without frames
            continue
        origin = Origin(old[0], old[1], rng.randint(0, batches), batch)
        interrupted = InterruptedEpoch(
            tuple(shards), seed=case, epoch=0, options=options, pool_size=pool_size, origin=origin, drop_last=False
        )
        for index in range(new[0] * max(1, new[1])):
            consumer = Consumer(index // max(1, new[1]), new[0], index % max(1, new[1]), max(1, new[1]))
            try:
                fast = plan_elastic(interrupted, consumer=consumer)
            except ValueError as error:  # equal counts but a new consumer without remaining frames
                assert "needs remaining frames on every consumer" in str(error)
                break
            with monkeypatch.context() as patched:
                patched.setattr(elastic, "_emitted_frames_cached", _emitted_by_replay)
                slow = plan_elastic(interrupted, consumer=consumer)
            assert fast.plan == slow.plan and fast.loads == slow.loads, (case, consumer)
            assert [list(f) for f in fast.frames] == [list(f) for f in slow.frames], (case, consumer)
            samplers = [SubsetSampler(p, pool_size, seed=case, epoch=0, shuffle=options.shuffle) for p in (fast, slow)]
            assert list(samplers[0]) == list(samplers[1])
            checked += 1
    assert checked >= 40
