import itertools

import numpy as np
import pytest

from lerobot_shards.loader.plan.partition import (
    SIZE_BUCKETS,
    Consumer,
    PlanOptions,
    ShardSpec,
    assign_shards,
    assignment_warnings,
    consumer_frames,
    equal_sample_count,
    plan_consumer,
    split_shards,
    work_units,
)
from lerobot_shards.loader.plan.resume import num_batches

FRAMES = [int(f) for f in np.random.default_rng(0).integers(100, 1000, size=23)]


def test_consumer_indices_cover_every_rank_and_worker_once():
    consumers = [Consumer(r, 3, w, 4) for r in range(3) for w in range(4)]
    assert sorted(c.index for c in consumers) == list(range(12))
    assert {c.count for c in consumers} == {12}


@pytest.mark.parametrize(
    "args, message",
    [
        ((3, 3, 0, 1), "rank must be in"),
        ((0, 0, 0, 1), "world_size"),
        ((0, 1, 2, 2), "worker must be in"),
        ((0, 1, 0, 0), "num_workers=0"),
    ],
)
def test_consumer_rejects_out_of_range(args, message):
    with pytest.raises(ValueError, match=message):
        Consumer(*args)


@pytest.mark.parametrize("num_consumers", [1, 4, 7, 23, 30])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_shard_exactly_once(num_consumers, shuffle):
    assignment = assign_shards(FRAMES, num_consumers, seed=1, epoch=2, shuffle=shuffle)
    assert len(assignment) == num_consumers
    flat = list(itertools.chain.from_iterable(assignment))
    assert sorted(flat) == list(range(len(FRAMES)))


@pytest.mark.parametrize("num_consumers", [2, 5, 8])
def test_balanced_within_one_shard(num_consumers):
    # Greedy: the heaviest consumer's last shard went to it while it was the lightest.
    for epoch in range(5):
        loads = consumer_frames(assign_shards(FRAMES, num_consumers, seed=0, epoch=epoch), FRAMES)
        assert max(loads) - min(loads) <= max(FRAMES)


def test_equal_shards_split_evenly_and_the_extra_shard_moves():
    shards_per_consumer = [[len(s) for s in assign_shards([10] * 5, 4, seed=0, epoch=e)] for e in range(12)]
    assert all(sorted(c) == [1, 1, 1, 2] for c in shards_per_consumer)
    assert len({c.index(2) for c in shards_per_consumer}) > 1


def test_deterministic_and_epoch_and_seed_dependent():
    a = assign_shards(FRAMES, 4, seed=3, epoch=0)
    assert a == assign_shards(FRAMES, 4, seed=3, epoch=0)
    assert a != assign_shards(FRAMES, 4, seed=3, epoch=1)
    assert a != assign_shards(FRAMES, 4, seed=4, epoch=0)


def test_shards_regroup_across_epochs():
    groups = [{frozenset(s) for s in assign_shards(FRAMES, 4, seed=0, epoch=e)} for e in range(2)]
    assert groups[0] != groups[1]


def test_equal_size_shards_change_consumer_across_epochs():
    assignments = [assign_shards([50] * 12, 3, seed=0, epoch=e) for e in range(2)]
    owners = [{s: c for c, shards in enumerate(a) for s in shards} for a in assignments]
    assert owners[0] != owners[1]


def test_reading_order_is_shuffled_unless_disabled():
    shuffled = assign_shards(FRAMES, 2, seed=0, epoch=0)
    assert any(shards != sorted(shards) for shards in shuffled)
    plain = [assign_shards(FRAMES, 3, seed=s, epoch=e, shuffle=False) for s, e in [(0, 0), (5, 9)]]
    assert plain[0] == plain[1]
    assert all(shards == sorted(shards) for shards in plain[0])


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="num_consumers"):
        assign_shards(FRAMES, 0, seed=0, epoch=0)
    with pytest.raises(ValueError, match="non-negative"):
        assign_shards([5, -1], 2, seed=0, epoch=0)


def test_no_warnings_when_balanced():
    frames = [100] * 8
    assert assignment_warnings(assign_shards(frames, 4, seed=0, epoch=0), frames) == []


def test_warns_about_idle_consumers():
    frames = [100, 100, 100]
    warnings = assignment_warnings(assign_shards(frames, 5, seed=0, epoch=0), frames)
    assert len(warnings) == 1
    assert "2 of 5 consumers" in warnings[0]
    assert "3 shards" in warnings[0] and "fewer DataLoader workers" in warnings[0]


def test_warns_about_uneven_frames_with_min_and_max():
    frames = [100, 100, 130]
    warnings = assignment_warnings(assign_shards(frames, 3, seed=0, epoch=0), frames)
    assert len(warnings) == 1
    assert "min 100" in warnings[0] and "max 130" in warnings[0]
    assignment = assign_shards(frames, 3, seed=0, epoch=0)
    assert assignment_warnings(assignment, frames, tolerance=0.5) == []


def test_equal_sample_count_gives_every_rank_the_same_batches():
    world_size, num_workers, batch_size = 2, 3, 16
    assignment = assign_shards(FRAMES, world_size * num_workers, seed=0, epoch=0)
    n = equal_sample_count(assignment, FRAMES)
    assert n == sum(FRAMES) // (world_size * num_workers)
    assert sum(FRAMES) - n * world_size * num_workers < world_size * num_workers
    rank_batches = {sum(num_batches(n, batch_size) for _ in range(num_workers)) for _ in range(world_size)}
    assert len(rank_batches) == 1


def test_equal_sample_count_rejects_idle_consumers():
    frames = [100, 100]
    with pytest.raises(ValueError, match="1 of 3"):
        equal_sample_count(assign_shards(frames, 3, seed=0, epoch=0), frames)


@pytest.mark.parametrize("seed", range(5))
def test_balance_is_within_the_smallest_shard(seed: int) -> None:
    """Largest-first greedy: consumer totals differ by at most about the smallest shard."""
    rng = np.random.default_rng(seed)
    frames = [int(x) for x in rng.integers(100, 250, size=24)]
    for consumers in (2, 3, 4):
        totals = consumer_frames(assign_shards(frames, consumers, seed=seed, epoch=1), frames)
        slack = max(frames) / SIZE_BUCKETS
        assert max(totals) - min(totals) <= min(frames) + slack, (consumers, totals)


@pytest.mark.parametrize("equal", [False, True])
def test_consumer_plans_cover_every_episode_once_and_agree_on_counts(equal):
    rng = np.random.default_rng(4)
    shards, episode = [], 0
    for index in range(9):
        lengths = tuple(int(n) for n in rng.integers(1, 50, size=int(rng.integers(1, 4))))
        shards.append(ShardSpec(index, tuple(range(episode, episode + len(lengths))), lengths))
        episode += len(lengths)
    options = PlanOptions(shuffle=True, equal_samples_per_rank=equal)
    plans = [
        plan_consumer(shards, seed=3, epoch=1, consumer=Consumer(r, 2, w, 2), options=options)
        for r in range(2)
        for w in range(2)
    ]
    seen = [e for p in plans for _, e in p.episodes]
    assert sorted(seen) == list(range(episode))
    length_of = {e: n for s in shards for e, n in zip(s.episodes, s.lengths)}
    for p in plans:
        assert list(p.lengths) == [length_of[e] for _, e in p.episodes]
        assert p.rank_samples == tuple(q.num_samples for q in plans if q.consumer.rank == p.consumer.rank)
    total = sum(s.frames for s in shards)
    assert sum(p.num_samples for p in plans) == (total // 4 * 4 if equal else total)


def _random_shards(rng: np.random.Generator, num_shards: int) -> list[ShardSpec]:
    shards, episode = [], 0
    for index in range(num_shards):
        lengths = tuple(int(n) for n in rng.integers(1, 60, size=int(rng.integers(1, 12))))
        shards.append(ShardSpec(index, tuple(range(episode, episode + len(lengths))), lengths))
        episode += len(lengths)
    return shards


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5, 13])
@pytest.mark.parametrize("world_size, num_workers", [(1, 1), (1, 2), (2, 2), (1, 5), (3, 4), (8, 2)])
@pytest.mark.parametrize("equal", [False, True])
def test_every_frame_once_and_no_idle_consumer_when_episodes_suffice(num_shards, world_size, num_workers, equal):
    rng = np.random.default_rng(num_shards * 100 + world_size * 10 + num_workers)
    shards = _random_shards(rng, num_shards)
    episodes = sum(len(s.episodes) for s in shards)
    options = PlanOptions(shuffle=True, equal_samples_per_rank=equal)
    count = world_size * num_workers
    if equal and episodes < count:
        return  # equal-count mode refuses idle consumers (tested elsewhere)
    plans = [
        plan_consumer(shards, seed=7, epoch=2, consumer=Consumer(r, world_size, w, num_workers), options=options)
        for r in range(world_size)
        for w in range(num_workers)
    ]
    seen = [e for p in plans for _, e in p.episodes]
    assert sorted(seen) == list(range(episodes))  # every episode (hence frame) exactly once
    shard_of = {e: s.index for s in shards for e in s.episodes}
    assert all(shard_of[e] == s for p in plans for s, e in p.episodes)  # read from the shard that holds it
    loads = [sum(p.lengths) for p in plans]
    if episodes >= count:
        assert min(loads) > 0  # no idle consumer
    longest = max(n for s in shards for n in s.lengths)
    mean = sum(loads) / count
    whole = consumer_frames(
        assign_shards([s.frames for s in shards], count, seed=7, epoch=2), [s.frames for s in shards]
    )
    # balanced within one episode of the mean, unless whole shards already balanced better
    assert max(loads) <= max(mean + longest, min(max(whole), mean * 1.05)), (loads, whole)
    # same inputs, same plan: every rank and worker computes it independently
    again = plan_consumer(shards, seed=7, epoch=2, consumer=plans[-1].consumer, options=options)
    assert again == plans[-1]


@pytest.mark.parametrize("num_consumers", [2, 3, 4, 7])
@pytest.mark.parametrize("shuffle", [False, True])
def test_split_cuts_contiguous_ranges_within_one_episode_of_the_mean(num_consumers, shuffle):
    shards = _random_shards(np.random.default_rng(num_consumers), 3)
    parts = split_shards(shards, num_consumers, seed=1, epoch=0, shuffle=shuffle)
    episodes = [e for part in parts for piece in part for e in piece.episodes]
    assert sorted(episodes) == sorted(e for s in shards for e in s.episodes)
    totals = [sum(p.frames for p in part) for part in parts]
    longest = max(n for s in shards for n in s.lengths)
    mean = sum(totals) / num_consumers
    assert all(abs(t - mean) <= longest for t in totals), (totals, mean, longest)
    for part in parts:  # pieces are runs of a shard's episodes in the shard's order
        for piece in part:
            source = next(s for s in shards if s.index == piece.index)
            start = source.episodes.index(piece.episodes[0])
            assert source.episodes[start : start + len(piece.episodes)] == piece.episodes
            assert source.lengths[start : start + len(piece.episodes)] == piece.lengths
    if not shuffle:  # source order, consumer k gets the k-th range
        assert [e for part in parts for piece in part for e in piece.episodes] == sorted(episodes)


def test_one_shard_is_split_across_workers_and_many_shards_stay_whole():
    one = [ShardSpec(0, tuple(range(93)), (300,) * 93)]
    units = work_units(one, 2, seed=0, epoch=0)
    assert [sum(p.frames for p in part) for part in units] == [300 * 46, 300 * 47] or [
        sum(p.frames for p in part) for part in units
    ] == [300 * 47, 300 * 46]
    many = [ShardSpec(i, (2 * i, 2 * i + 1), (50, 50)) for i in range(8)]
    units = work_units(many, 4, seed=0, epoch=0)
    assert sorted(len(part) for part in units) == [2, 2, 2, 2]
    assert all(piece in many for part in units for piece in part)  # whole shards: no piece is cut


def test_split_changes_with_the_epoch_and_is_deterministic():
    shards = _random_shards(np.random.default_rng(9), 2)
    a = split_shards(shards, 3, seed=4, epoch=0)
    assert a == split_shards(shards, 3, seed=4, epoch=0)
    assert a != split_shards(shards, 3, seed=4, epoch=1)


def test_no_uneven_warning_when_the_split_is_within_one_episode():
    shards = [ShardSpec(0, tuple(range(24)), tuple([100, 200] * 12))]
    plan = plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 1, 0, 2), options=PlanOptions())
    assert plan.warnings == ()
    uneven = assignment_warnings([[0], [1]], [1000, 1300], slack=200)
    assert len(uneven) == 1 and "uneven: min 1000, max 1300" in uneven[0]


def test_too_few_episodes_for_equal_counts_says_how_many_workers_fit() -> None:
    """3 episodes for 2 ranks x 2 workers: one consumer would read none; the error names the counts and the fixes."""
    shards = [ShardSpec(i, (i,), (10,)) for i in range(3)]
    equal = PlanOptions(equal_samples_per_rank=True)
    with pytest.raises(
        ValueError, match=r"3 episodes cannot give each of the 4 consumers \(2 ranks x 2 DataLoader"
    ) as e:
        plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 2, 0, 2), options=equal)
    assert "at most 1 DataLoader workers per rank, or equal_samples_per_rank=False" in str(e.value)
    plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 2, 0, 1), options=equal)  # 2 consumers: fine
    exact = PlanOptions(equal_samples_per_rank=False)  # every frame once: an idle worker is only warned about
    assert plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 2, 0, 2), options=exact).warnings


def test_uneven_warning_names_few_episodes_per_consumer_not_shard_size() -> None:
    """24 episodes of 60-120 frames over 8 workers: 3 whole episodes each cannot balance, whatever the
    shard size; the warning says so and points at fewer workers, not at smaller shards."""
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(60, 121, 24)]
    shards = [ShardSpec(i, (2 * i, 2 * i + 1), (lengths[2 * i], lengths[2 * i + 1])) for i in range(12)]
    options = PlanOptions()
    (warning,) = plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 1, 0, 8), options=options).warnings
    assert "frames per consumer are uneven" in warning and "smaller shards" not in warning
    assert f"24 episodes of {min(lengths)}-{max(lengths)} frames over 8 consumers" in warning
    assert "about 3.0 each" in warning and "fewer DataLoader workers" in warning
    assert not plan_consumer(shards, seed=0, epoch=0, consumer=Consumer(0, 1, 0, 4), options=options).warnings
    (idle,) = plan_consumer(shards[:2], seed=0, epoch=0, consumer=Consumer(0, 1, 0, 8), options=options).warnings
    assert idle.startswith("4 of 8 consumers (ranks x workers) get no episode: 4 episodes for 8 consumers")
    assert "smaller shards" not in idle


def test_uneven_warning_still_names_large_shards_when_they_are_the_cause() -> None:
    """Shards of 50, 50 and 10 one-frame episodes read whole by 3 consumers: a shard, not an
    episode, is the unit that could not be split, so smaller shards do help."""
    lengths = [1] * 110
    frames = [50, 50, 10]
    warnings = assignment_warnings([[0], [1], [2]], frames, episode_lengths=lengths)
    assert warnings == [
        f"frames per consumer are uneven: min 10, max 50 ({40 / (110 / 3):.0%} of the mean); smaller shards balance better"
    ]
