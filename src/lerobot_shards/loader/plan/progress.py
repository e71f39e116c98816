"""How far one consumer got into its epoch's order: what an elastic resume needs of each old consumer.

A consumer that emitted ``skip`` samples of its pure order (``PoolSampler`` over its plan) has
emitted whole every episode it admitted, except the resident ones, of which it emitted the first
frames of their permutations. That summary is small (an admitted count and, per resident episode,
its frames emitted: bounded by the pool, not the dataset), but finding it means running the
sampler to the cut: each pick depends on the frames every earlier pick left. ``PoolSampler.skip``
does that in Python at about 1 us per sample, so an elastic resume at 100M frames spent a minute
per new consumer. ``_progress`` is the same loop, compiled by numba when it is installed (about
40 ns per sample): it draws from the same generator in the same order (numba's ``Generator``
methods are numpy's, bit for bit; ``tests/test_elastic.py`` checks the summary against
``PoolSampler`` on random plans), so it reaches the same state. Without numba the sampler itself
is replayed. numba caches the compiled loop beside this file (or under ``NUMBA_CACHE_DIR``): the
first resume on a machine compiles it once, in seconds.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .sampling import FILL_EVERY, UNIFORM_BLOCK, PoolSampler, pool_slots


class Progress(NamedTuple):
    """A consumer's pass after ``skip`` samples: its positions below ``admitted`` were admitted, and
    the resident ones among them (``partial``) emitted only the frames listed; the others whole."""

    admitted: int
    partial: dict[int, np.ndarray]  # position -> frames emitted so far, in emission order


def consumer_progress(
    lengths: Sequence[int], pool_size: int, rng: np.random.Generator, skip: int, *, shuffle: bool = True
) -> Progress:
    """Where ``PoolSampler(lengths, pool_size, rng, shuffle=shuffle)`` stands after ``skip`` samples:
    ``PoolSampler.progress`` without the replay. ``skip`` may run past a pass (a mixture's source
    reads further passes, each drawn on from the same generator): the progress is its current
    pass's, a pass just ended being whole."""
    total = sum(lengths)
    if skip < 0:
        raise ValueError(f"skip must be non-negative, got {skip}")
    if skip == 0:
        return Progress(0, {})
    if total == 0:
        raise ValueError(f"skip={skip} but the episode list is empty")
    if not shuffle:  # episodes and frames in order: the first ``done`` episodes whole, then a prefix
        into = skip % total
        if into == 0:
            return Progress(len(lengths), {})
        ends = list(itertools.accumulate(lengths))
        done = bisect.bisect_right(ends, into)
        return Progress(done + 1, {done: np.arange(into - (ends[done - 1] if done else 0))})
    kernel = _kernel()
    if kernel is None:
        sampler = PoolSampler(lengths, pool_size, rng, num_samples=skip)
        sampler.skip(skip)
        return Progress(*sampler.progress())
    array = np.asarray(lengths, dtype=np.int64)
    pool_size = pool_slots(pool_size, len(lengths))
    admitted, position, remaining, emitted, orders = kernel(array, pool_size, rng, skip, FILL_EVERY, UNIFORM_BLOCK)
    partial = {
        int(position[s]): orders[s][: emitted[s]].copy()
        for s in range(pool_size)
        if position[s] >= 0 and remaining[s] > 0
    }
    return Progress(int(admitted), partial)


@functools.cache
def _kernel() -> Callable[..., Any] | None:
    """``_progress`` compiled (once per process; numba's on-disk cache spares the compile after the
    first), or None without numba."""
    try:
        import numba  # a second of import: only an elastic resume pays it
    except ImportError:
        return None
    return numba.njit(cache=True, nogil=True)(_progress)


def _progress(
    lengths: np.ndarray, pool_size: int, rng: np.random.Generator, skip: int, fill_every: int, block: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """``PoolSampler`` (shuffled) run for ``skip`` samples, pass after pass, written for numba: the same
    admissions, permutations, uniform blocks and picks in the same order. Returns the admitted
    count and each slot's episode position (-1: empty), frames left, frames emitted and permutation."""
    count = lengths.shape[0]
    position = np.full(pool_size, -1, np.int64)
    remaining = np.zeros(pool_size, np.int64)
    emitted = np.zeros(pool_size, np.int64)
    orders = [np.empty(0, np.int64) for _ in range(pool_size)]
    gradual = fill_every > 0 and pool_size > 1
    due = np.arange(max(pool_size, 2))  # the slots to admit into before the next pick, in order
    n_due = 1 if gradual else pool_size
    filling, since, pool, admitted, done = gradual, 0, 0, 0, 0
    uniforms = np.empty(0)
    cursor = 0
    while True:
        for i in range(n_due):  # PoolSampler._admit
            slot = due[i]
            if admitted >= count:
                position[slot], remaining[slot] = -1, 0
                continue
            position[slot], remaining[slot], emitted[slot] = admitted, lengths[admitted], 0
            orders[slot] = rng.permutation(lengths[admitted])
            pool += lengths[admitted]
            admitted += 1
        n_due = 0
        if done == skip:
            return admitted, position, remaining, emitted, orders
        if pool == 0:  # the pass is over: PoolSampler._start_pass, drawing on from the same generator
            for i in range(pool_size):
                due[i] = i
            n_due = 1 if gradual else pool_size
            filling, since, admitted = gradual, 0, 0
            continue
        if cursor == uniforms.shape[0]:  # PoolSampler._uniform
            uniforms = rng.random(block)
            cursor = 0
        target = min(int(uniforms[cursor] * pool), pool - 1)  # PoolSampler._pick_slot
        cursor += 1
        slot = 0
        while target >= remaining[slot]:
            target -= remaining[slot]
            slot += 1
        remaining[slot] -= 1
        emitted[slot] += 1
        pool -= 1
        done += 1
        if remaining[slot] == 0:  # finished: refilled first
            due[0] = slot
            n_due = 1
        if filling:  # PoolSampler._grow: then the first empty slot, every fill_every picks
            since += 1
            if since >= fill_every:
                since = 0
                empty = -1
                for j in range(pool_size):
                    if position[j] < 0:
                        empty = j
                        break
                if empty < 0 or admitted + n_due >= count:
                    filling = False
                else:
                    due[n_due] = empty
                    n_due += 1
