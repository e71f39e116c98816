"""The order in which one consumer emits frames: an episode pool over its episode list.

Everything here is a pure function of (episode lengths, pool size, seed, epoch, rank, worker),
so a resumed run can replay the order on these tables alone, without touching video.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

# Distinct first words keep the random streams of different purposes apart.
PARTITION_STREAM = 0x5041_5254  # "PART"
SAMPLER_STREAM = 0x5341_4D50  # "SAMP"

UNIFORM_BLOCK = 1024  # uniforms drawn per refill: one numpy call instead of one per emission
# A pass starts with one resident episode and admits one more every FILL_EVERY emissions until
# the pool is full: the first batch then waits for one episode's bytes, not the whole pool's.
FILL_EVERY = 8


def keyed_rng(*key: int) -> np.random.Generator:
    """A generator seeded by a tuple of non-negative ints below 2**64.

    The key's length leads and each int becomes two fixed 32-bit words, so keys of different
    shapes cannot collide (a plain SeedSequence pads with zeros, so (5,) and (5, 0) would).
    """
    words = [len(key)]
    for k in key:
        if not 0 <= k < 2**64:
            raise ValueError(f"seed key parts must be integers in [0, 2**64), got {k}")
        words += [k & 0xFFFF_FFFF, k >> 32]
    return np.random.default_rng(np.random.SeedSequence(words))


def consumer_rng(seed: int, epoch: int, rank: int, worker: int) -> np.random.Generator:
    """The sampler's generator for one (rank, worker) consumer in one epoch; decorrelated."""
    return keyed_rng(SAMPLER_STREAM, seed, epoch, rank, worker)


class Emission(NamedTuple):
    """One sample to emit: which episode of the list, which frame, and whether it is the episode's last."""

    position: int  # index into the consumer's episode list (reading order)
    frame: int  # frame index within that episode
    last: bool  # final emission of this episode in the current pass: evict it now


def pool_slots(pool_size: int, episodes: int) -> int:
    """The pool's slots: never more than the episodes to admit, whose slots beyond stay empty all
    along (an empty slot is skipped and draws nothing), so the order is the same, and a pool size
    of 10**18 is not a list of 10**18 slots (a bare MemoryError)."""
    return max(1, min(pool_size, episodes))


class PoolSampler(Iterator[Emission]):
    """Uniform random frames across a bounded pool of resident episodes, each frame once per pass.

    Episodes are admitted strictly in list order, at most ``pool_size`` at a time. Each emission
    is uniform over all not-yet-emitted frames of all resident episodes (pick an episode by its
    remaining frames, then its next frame from a permutation drawn at admission). A finished
    episode leaves and the next one is admitted, so the loader only ever holds ``pool_size``
    episodes and reads its shards sequentially. A pass starts with one resident episode and
    admits another every ``fill_every`` emissions until the pool is full (0: fill it at once),
    as a shuffle buffer warms up: the first samples need one episode read, not ``pool_size``,
    at the price of less mixing in the pass's first ``pool_size x fill_every`` emissions.
    ``shuffle=False`` emits episodes and frames in
    order (a pool of one). ``num_samples`` stops early, or runs further passes over the same list
    (fresh random order each) to reach it; a pass cut short leaves its residents without ``last``.

    The sampler owns ``rng``: iteration and ``skip`` draw from it identically, which is what
    makes ``skip(n)`` land in exactly the state of ``n`` emissions.
    """

    def __init__(
        self,
        episode_lengths: Sequence[int],
        pool_size: int,
        rng: np.random.Generator,
        *,
        shuffle: bool = True,
        num_samples: int | None = None,
        fill_every: int = FILL_EVERY,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        if fill_every < 0:
            raise ValueError(f"fill_every must be non-negative, got {fill_every}")
        self._lengths = [int(n) for n in episode_lengths]
        if any(n < 1 for n in self._lengths):
            raise ValueError("every episode must have at least one frame")
        frames_per_pass = sum(self._lengths)
        if num_samples is None:
            num_samples = frames_per_pass
        if num_samples < 0:
            raise ValueError(f"num_samples must be non-negative, got {num_samples}")
        if num_samples > 0 and frames_per_pass == 0:
            raise ValueError(f"num_samples={num_samples} but the episode list is empty")
        self.num_samples = num_samples
        self._rng = rng
        self._shuffle = shuffle
        slots = pool_slots(pool_size, len(self._lengths)) if shuffle else 1
        self._position = [-1] * slots  # episode in each slot, -1 when empty
        self._remaining = [0] * slots  # frames of that episode not yet emitted
        self._order: list[np.ndarray | None] = [None] * slots  # frame permutation (shuffle only)
        self._emitted_in_slot = [0] * slots
        self._pool_remaining = 0
        self._next_admit = 0
        self._fill_every = fill_every
        self._filling = False  # the pass's pool is still growing by one episode per fill_every
        self._since_fill = 0
        self._uniforms = np.empty(0)
        self._uniform_cursor = 0
        self._emitted = 0

    @property
    def emitted(self) -> int:
        """Emissions so far (iterated or skipped)."""
        return self._emitted

    @property
    def resident(self) -> list[int]:
        """Positions admitted and not yet finished: the episodes the loader must hold now."""
        return sorted(p for p, r in zip(self._position, self._remaining) if r > 0)

    def progress(self) -> tuple[int, dict[int, np.ndarray]]:
        """What this pass has emitted, read off the state instead of replayed emission by emission.

        Returns ``(admitted, partial)``: the positions below ``admitted`` were admitted this pass;
        those in ``partial`` are resident, with the frames they have emitted so far, and the
        others were emitted whole. (After a whole pass, ``admitted`` is the list's length and
        ``partial`` is empty.)
        """
        partial = {}
        for slot, position in enumerate(self._position):
            if position >= 0 and self._remaining[slot] > 0:
                k = self._emitted_in_slot[slot]
                order = self._order[slot]
                partial[position] = np.arange(k) if order is None else order[:k].copy()
        return self._next_admit, partial

    def admission_order(self) -> Iterator[tuple[int, int]]:
        """(pass, position) of every episode still to be used, in the order the pool admits them.

        After a fast-forward, the episodes already used up are left out: the resident ones come
        first, then the rest of the list, then any further passes (equal-count mode). The state
        is read now, not when the iterator first runs: the reader thread consumes the iterator
        while the training thread keeps advancing the sampler.
        """
        n = len(self._lengths)
        per_pass = sum(self._lengths)
        if per_pass == 0:
            return iter(())
        current = self._emitted // per_pass
        passes = -(-self.num_samples // per_pass)
        resident = self.resident
        first = resident + list(range(max(resident) + 1, n)) if resident else list(range(n))
        later = ((p, position) for p in range(current + 1, passes) for position in range(n))
        return itertools.chain(((current, position) for position in first), later)

    def __iter__(self) -> PoolSampler:
        return self

    def __next__(self) -> Emission:
        if self._emitted >= self.num_samples:
            raise StopIteration
        return self._advance()

    def skip(self, n: int) -> None:
        """Advance ``n`` emissions (fast-forward on resume); raises if fewer than ``n`` remain."""
        if not 0 <= n <= self.num_samples - self._emitted:
            raise ValueError(f"cannot skip {n}: {self.num_samples - self._emitted} emissions remain")
        for _ in range(n):
            self._advance()

    def _advance(self) -> Emission:
        if self._pool_remaining == 0:
            self._start_pass()
        slot = self._pick_slot()
        k = self._emitted_in_slot[slot]
        order = self._order[slot]
        frame = k if order is None else int(order[k])
        self._emitted_in_slot[slot] = k + 1
        self._remaining[slot] -= 1
        self._pool_remaining -= 1
        self._emitted += 1
        position = self._position[slot]
        last = self._remaining[slot] == 0
        if last:
            self._admit(slot)
        if self._filling:
            self._grow()
        return Emission(position, frame, last)

    def _grow(self) -> None:
        self._since_fill += 1
        if self._since_fill < self._fill_every:
            return
        self._since_fill = 0
        empty = next((slot for slot, p in enumerate(self._position) if p < 0), None)
        if empty is None or self._next_admit >= len(self._lengths):
            self._filling = False
            return
        self._admit(empty)

    def _pick_slot(self) -> int:
        if not self._shuffle:
            return 0
        # Integer target in [0, pool_remaining): slot chosen with probability remaining/total.
        target = min(int(self._uniform() * self._pool_remaining), self._pool_remaining - 1)
        for slot, remaining in enumerate(self._remaining):
            if target < remaining:
                return slot
            target -= remaining
        raise AssertionError("unreachable: target is below the pool's remaining frames")

    def _uniform(self) -> float:
        if self._uniform_cursor == len(self._uniforms):
            self._uniforms = self._rng.random(UNIFORM_BLOCK)
            self._uniform_cursor = 0
        u = self._uniforms[self._uniform_cursor]
        self._uniform_cursor += 1
        return float(u)

    def _start_pass(self) -> None:
        self._next_admit = 0
        self._since_fill = 0
        gradual = self._fill_every > 0 and len(self._position) > 1
        for slot in range(1 if gradual else len(self._position)):
            self._admit(slot)
        self._filling = gradual

    def _admit(self, slot: int) -> None:
        """Fill ``slot`` with the next episode in list order, or leave it empty at pass end."""
        if self._next_admit >= len(self._lengths):
            self._position[slot], self._remaining[slot], self._order[slot] = -1, 0, None
            return
        length = self._lengths[self._next_admit]
        self._position[slot] = self._next_admit
        self._remaining[slot] = length
        self._order[slot] = self._rng.permutation(length) if self._shuffle else None
        self._emitted_in_slot[slot] = 0
        self._pool_remaining += length
        self._next_admit += 1
