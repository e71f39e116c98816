"""Elastic resume: finish an interrupted epoch under another world size or worker count.

The frames the interrupted run emitted are recomputed on tables alone, from a summary of where
each old consumer stopped (``progress.py``): its plan (all of them from one layout,
``plan_consumers``) and its position in its pure order, the samples the round-robin gave it out
of the ``batches_consumed`` each old rank consumed. Episodes it admitted and finished were emitted
whole; of the resident ones, the frames its sampler's state lists. Finding that state still
means running each old consumer's sampler to the cut, but compiled (``progress._progress``, about
40 ns per sample against 1 us for ``PoolSampler.skip``, which stays the reference), once per
process, so nothing is kept per emitted frame and 100M frames take seconds, not minutes. The
frames not yet emitted are then laid out again over the new consumers by ``split_shards``
(contiguous episode ranges, balanced by remaining frames, so reads stay sequential; in a
node-sticky plan each node's remaining frames over that node's consumers, the node count being
part of the order), and each
consumer draws uniformly over the remaining frames of its resident episodes (``SubsetSampler``).
Every not-yet-emitted frame is emitted exactly once (equal-count mode: every new consumer yields
``remaining // consumers`` samples, dropping or repeating like the equal mode of a full epoch).
All of it is a pure function of metadata, seed, epoch and the two layouts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .partition import (
    Consumer,
    ConsumerPlan,
    PlanOptions,
    ShardSpec,
    filter_shards,
    node_layout,
    node_parts,
    plan_consumers,
    ranks_per_node,
    split_shards,
)
from .progress import consumer_progress
from .resume import Segments, samples_to_skip
from .sampling import Emission, PoolSampler, consumer_rng, keyed_rng

ELASTIC_STREAM = 0x454C_4153  # "ELAS": the resumed consumers' own random stream


@dataclass(frozen=True)
class Origin:
    """The interrupted run: its layout and how far every rank got."""

    world_size: int
    num_workers: int  # DataLoader num_workers (0: the main process)
    batches_consumed: int  # per rank
    batch_size: int
    earlier: Segments = ()  # its epoch's batches of earlier batch sizes, before those of ``batch_size``

    def segments(self) -> Segments:
        """Its batches by batch size, in order (``resume.Segments``)."""
        return (*self.earlier, (self.batches_consumed - sum(b for b, _ in self.earlier), self.batch_size))


@dataclass(frozen=True)
class InterruptedEpoch:
    """The epoch an elastic resume finishes, whole: the dataset's plan and order settings, the epoch
    and the run that was interrupted in it (``origin``), everything that fixes which frames that run
    emitted (``emitted_frames`` replays it) and how the rest is laid out (``plan_elastic``).

    It is one value, frozen and hashable, because it is the key of ``_emitted_frames_cached``: the
    value a rank passes to ``find_emitted`` before its DataLoader workers fork equals, and hashes
    as, the one each worker's ``plan_elastic`` looks up, so the workers inherit the result.
    """

    shards: tuple[ShardSpec, ...]
    seed: int
    epoch: int
    options: PlanOptions
    pool_size: int
    origin: Origin
    drop_last: bool


@dataclass(frozen=True)
class ElasticPlan:
    """One new consumer's share of the rest of the epoch."""

    plan: ConsumerPlan  # lengths are the remaining frames of each episode
    frames: tuple[Sequence[int], ...]  # the remaining frame indices of each episode, ascending
    loads: tuple[int, ...] = ()  # remaining frames of every new consumer (rank-major)


class Drawn(NamedTuple):
    """How far an interrupted consumer got, for a reader whose consumers draw other counts than their
    plans' (a mixture's sources, ``loader.mix``): its sampler's generator (fresh), the samples it
    had drawn and the samples it was to draw in all (past its pass: further passes)."""

    rng: np.random.Generator
    drawn: int
    num_samples: int


Replay = Callable[[Consumer, ConsumerPlan], Drawn]
# Episode -> the frames an interrupted run emitted of it (None: all of them), as ``emitted_frames`` finds.
Emitted = Mapping[int, np.ndarray | None]


def emitted_frames(interrupted: InterruptedEpoch, replay: Replay | None = None) -> dict[int, np.ndarray | None]:
    """Episode -> frames the interrupted run emitted this epoch (``None``: all of them), from where each
    of its consumers stopped (``replay``: how to find it; default the dataset's own samplers and
    counts, ``progress.consumer_progress``); episodes it did not reach are absent."""
    shards, seed, epoch, options = interrupted.shards, interrupted.seed, interrupted.epoch, interrupted.options
    origin = interrupted.origin
    emitted: dict[int, np.ndarray | None] = {}
    plans = plan_consumers(
        shards,
        seed=seed,
        epoch=epoch,
        world_size=origin.world_size,
        num_workers=max(1, origin.num_workers),
        options=options,
    )
    for plan in plans:
        consumer = plan.consumer
        if replay is None:
            skip = samples_to_skip(origin.segments(), plan.rank_samples, consumer.worker, interrupted.drop_last)
            whole = skip >= sum(plan.lengths)  # a whole pass (equal-count mode repeats frames after it)
            rng = consumer_rng(seed, epoch, consumer.rank, consumer.worker)
        else:
            rng, skip, num_samples = replay(consumer, plan)
            # A consumer that reads further passes (a mixture's source) and has samples to come
            # stands in its current pass.
            whole = skip >= sum(plan.lengths) and skip >= num_samples
        if not whole:
            admitted, partial = consumer_progress(
                plan.lengths, interrupted.pool_size, rng, skip, shuffle=options.shuffle
            )
        if whole:
            emitted.update((e, None) for _, e in plan.episodes)
            continue
        for position in range(admitted):
            emitted[plan.episodes[position][1]] = partial.get(position)  # None: emitted whole
    return emitted


# The last emitted_frames of this process, keyed by the ``InterruptedEpoch``: an iterator that resumes
# after the elastic origin plans twice, and DataLoader workers forked after ``find_emitted`` ran in
# their rank's process find it here.
_emitted_frames_cached = functools.lru_cache(maxsize=1)(emitted_frames)


def find_emitted(interrupted: InterruptedEpoch) -> None:
    """Where ``interrupted.origin``'s consumers stopped, found now and kept for ``plan_elastic`` in this
    process (the key is the ``InterruptedEpoch`` it will be given): a rank calls it before its
    DataLoader workers fork, so they inherit the result instead of each finding it again (~3 s of
    CPU each at 100M frames)."""
    _emitted_frames_cached(interrupted)


def plan_elastic(
    interrupted: InterruptedEpoch,
    *,
    consumer: Consumer,
    emitted: Emitted | None = None,
    only: Collection[int] | None = None,
) -> ElasticPlan:
    """``consumer``'s remaining episodes, frames and sample count for the rest of the ``interrupted``
    epoch (``emitted``: what the interrupted run emitted, found by the caller with ``emitted_frames``;
    ``only``: of these episodes, the others left out; a mixture lays out some old consumers' apart)."""
    mixture = emitted is not None  # a mixture's source: its consumers draw other counts than their plans'
    if emitted is None:
        emitted = _emitted_frames_cached(interrupted)
    shards, seed, epoch, options = interrupted.shards, interrupted.seed, interrupted.epoch, interrupted.options
    frames: dict[int, Sequence[int]] = {}
    remaining: list[ShardSpec] = []
    for s in shards:
        kept = []
        for e, n in zip(s.episodes, s.lengths):
            if only is not None and e not in only:
                continue
            if e not in emitted:
                frames[e] = range(n)
            elif (done := emitted[e]) is None:
                continue
            else:
                left = np.ones(n, dtype=bool)
                left[done] = False
                frames[e] = tuple(np.flatnonzero(left).tolist())
            if frames[e]:
                kept.append((e, len(frames[e])))
        if kept:
            remaining.append(ShardSpec(s.index, tuple(e for e, _ in kept), tuple(n for _, n in kept)))
    parts = [
        filter_shards(remaining, {e for s in part for e in s.episodes})
        for part in node_parts(shards, options.nodes, seed=seed, shuffle=options.shuffle)
    ]
    per_node = ranks_per_node(consumer.world_size, options.nodes) * consumer.num_workers
    units = node_layout(parts, per_node, seed=seed, epoch=epoch, shuffle=options.shuffle, layout=split_shards)
    loads = [sum(s.frames for s in mine) for mine in units]
    counts = [sum(loads) // len(loads)] * len(loads) if options.equal_samples_per_rank else loads
    if not mixture and options.equal_samples_per_rank and counts[0] and not all(loads):
        raise ValueError(
            f"elastic resume in equal-count mode needs remaining frames on every consumer, but only "
            f"{sum(1 for n in loads if n)} of {len(loads)} have some; resume with fewer ranks or workers"
        )
    mine = units[consumer.index]
    first = consumer.rank * consumer.num_workers
    plan = ConsumerPlan(
        consumer=consumer,
        episodes=tuple((s.index, e) for s in mine for e in s.episodes),
        lengths=tuple(n for s in mine for n in s.lengths),
        num_samples=counts[consumer.index],
        rank_samples=tuple(counts[first : first + consumer.num_workers]),
        warnings=(),
    )
    return ElasticPlan(plan, tuple(frames[e] for _, e in plan.episodes), tuple(loads))


def elastic_rng_key(seed: int, epoch: int, rank: int, worker: int) -> tuple[int, ...]:
    """The key of a resumed consumer's generator: apart from every full-epoch consumer's."""
    return (ELASTIC_STREAM, seed, epoch, rank, worker)


class SubsetSampler(Iterator[Emission]):
    """A ``PoolSampler`` over each episode's remaining frames, emitting their real frame indices."""

    def __init__(self, elastic: ElasticPlan, pool_size: int, *, seed: int, epoch: int, shuffle: bool) -> None:
        plan = elastic.plan
        rng = keyed_rng(*elastic_rng_key(seed, epoch, plan.consumer.rank, plan.consumer.worker))
        self._inner = PoolSampler(plan.lengths, pool_size, rng, shuffle=shuffle, num_samples=plan.num_samples)
        self._frames = elastic.frames
        self.num_samples = self._inner.num_samples

    def admission_order(self) -> Iterator[tuple[int, int]]:
        """As ``PoolSampler.admission_order``."""
        return self._inner.admission_order()

    def skip(self, n: int) -> None:
        """As ``PoolSampler.skip``."""
        self._inner.skip(n)

    def __iter__(self) -> SubsetSampler:
        return self

    def __next__(self) -> Emission:
        e = next(self._inner)
        return Emission(e.position, self._frames[e.position][e.frame], e.last)
