from collections import Counter

import numpy as np
import pytest

from lerobot_shards.loader.plan.sampling import PoolSampler, consumer_rng, keyed_rng

LENGTHS = [5, 1, 8, 3, 6, 2, 7]


def emissions(lengths=LENGTHS, pool_size=3, seed=0, **kw) -> list[tuple[int, int, bool]]:
    return list(PoolSampler(lengths, pool_size, np.random.default_rng(seed), **kw))


def all_frames(lengths) -> set[tuple[int, int]]:
    return {(p, f) for p, n in enumerate(lengths) for f in range(n)}


@pytest.mark.parametrize("pool_size", [1, 3, 100])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_frame_exactly_once_and_last_marks_the_final_emission(pool_size, shuffle):
    out = emissions(pool_size=pool_size, shuffle=shuffle)
    pairs = [(p, f) for p, f, _ in out]
    assert len(pairs) == sum(LENGTHS)
    assert set(pairs) == all_frames(LENGTHS)
    last_index = {p: i for i, (p, _, _) in enumerate(out)}
    assert [i for i, (_, _, last) in enumerate(out) if last] == sorted(last_index.values())


def test_unshuffled_is_source_order():
    assert [(p, f) for p, f, _ in emissions(shuffle=False)] == [(p, f) for p, n in enumerate(LENGTHS) for f in range(n)]


@pytest.mark.parametrize("pool_size", [1, 2, 4])
def test_pool_bound_and_admission_in_list_order(pool_size):
    sampler = PoolSampler(LENGTHS, pool_size, np.random.default_rng(3))
    admitted: list[int] = []
    finished: set[int] = set()
    for position, _, last in sampler:
        resident = sampler.resident
        assert len(resident) <= pool_size
        assert position in resident or last
        admitted += [p for p in resident if p not in admitted]
        if last:
            finished.add(position)
            assert position not in resident
        assert not finished & set(resident)
    assert admitted == list(range(len(LENGTHS)))


def test_deterministic_and_seed_dependent():
    assert emissions(seed=7) == emissions(seed=7)
    assert emissions(seed=7) != emissions(seed=8)


def test_consumer_rngs_differ_across_seed_epoch_rank_worker():
    keys = [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (0, 0, 1, 1)]
    draws = {consumer_rng(*k).integers(2**62) for k in keys}
    assert len(draws) == len(keys)
    assert consumer_rng(3, 2, 1, 0).integers(2**62) == consumer_rng(3, 2, 1, 0).integers(2**62)


def test_keyed_rng_keys_of_different_shapes_do_not_collide():
    draw = lambda *k: keyed_rng(*k).integers(2**62)  # noqa: E731
    assert draw(5) != draw(5, 0)
    assert draw(2**32) != draw(0, 1)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        keyed_rng(-1)


def test_pool_interleaves_episodes_and_first_emission_varies():
    firsts = {emissions(seed=s, fill_every=0)[0][0] for s in range(20)}
    assert len(firsts) > 1
    positions = [p for p, _, _ in emissions(pool_size=3, seed=1)]
    switches = sum(a != b for a, b in zip(positions, positions[1:]))
    assert switches > len(LENGTHS) - 1  # more than one contiguous run per episode


@pytest.mark.parametrize("fill_every", [1, 4])
def test_pool_starts_with_one_episode_and_grows_by_one_every_fill_every(fill_every):
    lengths = [40] * 6
    sampler = PoolSampler(lengths, 4, np.random.default_rng(2), fill_every=fill_every)
    sizes = []
    for _ in range(6 * fill_every):
        next(sampler)
        sizes.append(len(sampler.resident))
    # After n emissions the pool holds 1 + n // fill_every episodes, capped at the pool size.
    assert sizes == [min(4, 1 + n // fill_every) for n in range(1, 6 * fill_every + 1)]
    assert {p for p, _, _ in emissions(lengths, 4, seed=2, fill_every=fill_every)[:fill_every]} == {0}


def test_fill_every_zero_starts_with_a_full_pool_and_fill_changes_only_the_order():
    sampler = PoolSampler(LENGTHS, 3, np.random.default_rng(0), fill_every=0)
    next(sampler)
    assert len(sampler.resident) + 1 >= 3  # the first emission may have finished the 1-frame episode
    gradual, at_once = emissions(seed=4), emissions(seed=4, fill_every=0)
    assert gradual != at_once
    assert sorted((p, f) for p, f, _ in gradual) == sorted((p, f) for p, f, _ in at_once)
    with pytest.raises(ValueError, match="fill_every"):
        PoolSampler(LENGTHS, 3, np.random.default_rng(0), fill_every=-1)


def test_episode_chosen_in_proportion_to_remaining_frames():
    # Uniform over the pool's frames: a 1-frame episode beside a 9-frame one comes first 10% of
    # the time (uniform over episodes would give 50%).
    firsts = Counter(emissions([1, 9], pool_size=2, seed=s, fill_every=0)[0][0] for s in range(2000))
    assert 0.07 < firsts[0] / 2000 < 0.13


def test_frames_within_an_episode_are_shuffled_uniformly():
    firsts = Counter(emissions([4], pool_size=1, seed=s)[0][1] for s in range(2000))
    assert set(firsts) == {0, 1, 2, 3}
    assert all(400 < c < 600 for c in firsts.values())


def test_num_samples_below_total_is_a_prefix():
    full = emissions(seed=4)
    assert emissions(seed=4, num_samples=10) == full[:10]


def test_num_samples_above_total_runs_fresh_passes():
    total = sum(LENGTHS)
    out = emissions(seed=5, num_samples=2 * total + 4)
    assert len(out) == 2 * total + 4
    first, second = out[:total], out[total : 2 * total]
    for one_pass in (first, second):
        assert {(p, f) for p, f, _ in one_pass} == all_frames(LENGTHS)
        assert sum(last for _, _, last in one_pass) == len(LENGTHS)
    assert first != second
    assert first == emissions(seed=5)


@pytest.mark.parametrize("fill_every", [0, 1, 8])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n", [0, 1, 13, 32, 40, 75])
def test_skip_lands_in_the_state_of_full_iteration(n, shuffle, fill_every):
    kwargs = dict(shuffle=shuffle, num_samples=80, fill_every=fill_every)  # 80 > 32 frames: crosses passes
    iterated = PoolSampler(LENGTHS, 3, np.random.default_rng(9), **kwargs)
    prefix = [next(iterated) for _ in range(n)]
    skipped = PoolSampler(LENGTHS, 3, np.random.default_rng(9), **kwargs)
    skipped.skip(n)
    assert len(prefix) == n
    assert skipped.emitted == iterated.emitted == n
    assert skipped.resident == iterated.resident
    assert list(skipped) == list(iterated)


def test_skip_past_the_end_raises():
    sampler = PoolSampler(LENGTHS, 2, np.random.default_rng(0))
    sampler.skip(30)
    with pytest.raises(ValueError, match="2 emissions remain"):
        sampler.skip(3)


def test_empty_list_yields_nothing_and_invalid_inputs_raise():
    assert emissions([]) == []
    with pytest.raises(ValueError, match="empty"):
        PoolSampler([], 2, np.random.default_rng(0), num_samples=1)
    with pytest.raises(ValueError, match="pool_size"):
        PoolSampler(LENGTHS, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="at least one frame"):
        PoolSampler([3, 0], 2, np.random.default_rng(0))


@pytest.mark.parametrize("n", [0, 5, 13, 32, 40])
def test_admission_order_covers_the_remaining_episodes_and_is_taken_at_the_call(n):
    sampler = PoolSampler(LENGTHS, 3, np.random.default_rng(9), num_samples=80)
    sampler.skip(n)
    order = sampler.admission_order()
    per_pass, emitted, needed = sum(LENGTHS), n, []
    for emission in sampler:  # the training thread advances before the reader thread consumes the order
        needed.append((emitted // per_pass, emission.position))
        emitted += 1
    order = list(order)
    assert len(order) == len(set(order))
    assert set(needed) <= set(order)
    assert {p for p, _ in set(order) - set(needed)} <= {80 // per_pass}  # only the cut-short last pass's tail


@pytest.mark.parametrize("lengths", [LENGTHS, [4]])
def test_a_pool_larger_than_the_episodes_is_their_count(lengths) -> None:
    """A pool of 10**18 (an option or a resume state's) was a list of 10**18 slots: a bare MemoryError.
    Slots beyond the episodes stay empty, so the order is the one of a pool of every episode."""
    from lerobot_shards.loader.plan.progress import consumer_progress

    huge = 10**18
    assert emissions(lengths, huge) == emissions(lengths, len(lengths)) == emissions(lengths, 100)
    for skip in range(1, sum(lengths)):
        got = consumer_progress(lengths, huge, np.random.default_rng(0), skip)
        want = consumer_progress(lengths, len(lengths), np.random.default_rng(0), skip)
        assert got.admitted == want.admitted and got.partial.keys() == want.partial.keys()
        assert all(np.array_equal(got.partial[k], want.partial[k]) for k in want.partial)
