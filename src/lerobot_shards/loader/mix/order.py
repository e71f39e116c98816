"""The order of a mixture's epoch: which source each sample comes from, and where each source stands.

Pure functions of (the sources' plans, counts, seed, epoch, rank, worker), like the single-dataset
order (``checkpoint.EpochOrder``), which each source keeps:

- **Shares.** Source d gives ``counts[d]`` samples per epoch (``mixture_spec.source_counts``),
  split over the (rank x worker) consumers by the frames each consumer holds of that source
  (``partition.work_units``, the source's own partition: ranks and workers read disjoint parts of
  every source). The split telescopes, so the shares add up to ``counts[d]`` exactly; in
  equal-count mode every consumer gets ``counts[d] // consumers`` instead, so every rank yields
  the same number of samples (DDP) at the price of at most ``consumers - 1`` samples per source.
- **Schedule.** A consumer's sequence of source indices is a jittered stratified interleave: the
  k-th of source d's n samples sits at a uniform random point of ``[k/n, (k+1)/n)`` and the
  points are sorted. Every prefix then holds each source within about one sample of its share
  (far closer than independent draws), and the counts are exact.
- **Per-source streams.** Each source is read by its own sampler (``PoolSampler``: the episode
  pool, uniform frames, each frame once per pass, further passes with fresh order when the share
  exceeds the frames) over the source's own consumer plan, with its own random stream.
- **Resume.** A consumer fast-forwarded over its first s samples stands, in source d, at the
  count of d in the schedule's first s entries: each source skips that many (``PoolSampler.skip``).
  An epoch resumed under another layout (``elastic.py``) replays the interrupted consumers'
  schedules to learn how far each got in each source, then lays out the frames each source's
  current passes have left over the new consumers (``plan_elastic``), read once each, then the
  passes its share still holds after them, each over the frames of the old consumers it reaches.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..plan.elastic import Drawn, ElasticPlan, Emitted, Origin, SubsetSampler, emitted_frames
from ..plan.order import EpochOrder, ResumeState, elastic_origin, known_origin
from ..plan.partition import Consumer, ConsumerPlan, ShardSpec, split_shards, work_units
from ..plan.resume import Segments, resume_point, samples_to_skip
from ..plan.sampling import PoolSampler, keyed_rng

MIX_SCHEDULE = 0x4D49_5853  # "MIXS": the schedule's random stream
MIX_SAMPLER = 0x4D49_5850  # "MIXP": a source's sampler in a mixture
MIX_SOURCE_SEED = 0x4D49_5845  # "MIXE": a source's seed for its elastic sampler
ELASTIC_FLAG = 1 << 32  # added to the worker in keys of an elastic-resumed epoch's streams


def interleave(shares: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Source indices, ``shares[d]`` of each d, in a jittered stratified order (see the module)."""
    labels = np.repeat(np.arange(len(shares), dtype=np.int32), shares)
    keys = [(np.arange(n) + rng.random(n)) / n for n in shares if n]
    if not keys:
        return labels
    return labels[np.argsort(np.concatenate(keys), kind="stable")]


def interleaved_counts(shares: Sequence[int], rng: np.random.Generator, head: int) -> np.ndarray:
    """``np.bincount(interleave(shares, rng)[:head], minlength=len(shares))`` without sorting the
    whole schedule: the ``head`` smallest keys found by selection (O(n), where the sort is
    O(n log n)), ties taken in the sort's stable order. An elastic resume asks it of every
    interrupted consumer."""
    labels = np.repeat(np.arange(len(shares), dtype=np.int32), shares)
    keys = [(np.arange(n) + rng.random(n)) / n for n in shares if n]
    if head <= 0 or not keys:
        return np.zeros(len(shares), dtype=np.int64)
    if head >= len(labels):
        return np.bincount(labels, minlength=len(shares))
    every = np.concatenate(keys)
    cut = np.partition(every, head - 1)[head - 1]
    below = labels[every < cut]
    tied = labels[every == cut][: head - len(below)]  # in concatenation order, as the stable sort puts them
    return np.bincount(np.concatenate([below, tied]), minlength=len(shares))


def apportion(total: int, loads: Sequence[int], index: int, equal: bool) -> int:
    """Consumer ``index``'s part of ``total`` samples: by its ``loads`` (telescoping floors), or equal."""
    if equal:
        return total // len(loads)
    frames = sum(loads)
    if frames == 0:
        return 0
    before = sum(loads[:index])
    return total * (before + loads[index]) // frames - total * before // frames


class Part(NamedTuple):
    """One source's stream in one consumer: its plan, its sampler and the samples it skipped."""

    plan: ConsumerPlan
    sampler: PoolSampler | SubsetSampler
    skip: int


class Cut(NamedTuple):
    """Where one interrupted consumer stood in one source."""

    shards: tuple[ShardSpec, ...]  # its part of the source
    frames: int  # frames of that part: one pass
    current: int  # frames its current pass had left (all of them when it had not started)
    owed: int  # samples its share still held


class MixStart(NamedTuple):
    """Where one iterator of a mixture starts: the rest of its schedule and each source's part."""

    schedule: np.ndarray
    parts: tuple[tuple[Part, ...], ...]  # each source's, read one after another


@dataclass(frozen=True)
class MixtureOrder:
    """Every source's order (``EpochOrder``, this rank's) and its samples per epoch."""

    orders: tuple[EpochOrder, ...]
    counts: tuple[int, ...]
    names: tuple[str, ...] = ()  # for errors

    @property
    def first(self) -> EpochOrder:
        return self.orders[0]  # the settings every source shares (seed, pool, layout)

    def source_seed(self, d: int) -> int:
        """Source d's own seed for its samplers' random streams, apart from every other source's."""
        return int(keyed_rng(MIX_SOURCE_SEED, self.first.seed, d).integers(2**63))

    def shares(self, epoch: int, consumer: Consumer) -> tuple[int, ...]:
        """Samples of each source that ``consumer`` yields in ``epoch`` (see the module)."""
        return tuple(
            apportion(n, self._loads(d, consumer.count, epoch), consumer.index, o.equal_samples_per_rank)
            for d, (o, n) in enumerate(zip(self.orders, self.counts))
        )

    @functools.cached_property
    def _loads_seen(self) -> dict[tuple[int, int, int], tuple[int, ...]]:
        return {}

    def _loads(self, d: int, consumers: int, epoch: int) -> tuple[int, ...]:
        """Frames of every consumer in source d (``partition.work_units``), kept by (source, consumers,
        epoch): an elastic resume asks for them once per old consumer and source, and hashing the
        source's shard list for a shared cache cost more than the layout at 100k episodes."""
        key = (d, consumers, epoch)
        if key not in self._loads_seen:
            o = self.orders[d]
            units = work_units(o.shards, consumers, seed=o.seed, epoch=epoch, shuffle=o.shuffle)
            self._loads_seen[key] = tuple(sum(s.frames for s in mine) for mine in units)
        return self._loads_seen[key]

    def schedule(self, epoch: int, consumer: Consumer, shares: Sequence[int], elastic: bool = False) -> np.ndarray:
        """The consumer's source indices in ``epoch`` (an elastic epoch's on their own stream)."""
        return interleave(shares, self._schedule_rng(epoch, consumer, elastic))

    def _schedule_rng(self, epoch: int, consumer: Consumer, elastic: bool = False) -> np.random.Generator:
        worker = consumer.worker + (ELASTIC_FLAG if elastic else 0)
        return keyed_rng(MIX_SCHEDULE, self.first.seed, epoch, consumer.rank, worker)

    def sampler(self, d: int, plan: ConsumerPlan, num_samples: int, epoch: int, elastic: bool = False) -> PoolSampler:
        """Source d's sampler on ``plan`` for ``num_samples`` samples (its own random stream)."""
        o = self.orders[d]
        rng = self.sampler_rng(d, plan, epoch, elastic)
        return PoolSampler(plan.lengths, o.pool_size, rng, shuffle=o.shuffle, num_samples=num_samples)

    def sampler_rng(self, d: int, plan: ConsumerPlan, epoch: int, elastic: bool = False) -> np.random.Generator:
        """The generator of source d's sampler on ``plan`` (fresh): an elastic resume runs it again,
        compiled, to find where an interrupted consumer stood (``progress.consumer_progress``)."""
        c = plan.consumer
        worker = c.worker + (ELASTIC_FLAG if elastic else 0)
        return keyed_rng(MIX_SAMPLER, self.first.seed, epoch, c.rank, worker, d)

    def rank_counts(self, epoch: int, rank: int, world_size: int, num_workers: int) -> list[int]:
        """Samples of every worker's stream on ``rank`` (what ``resume_point`` needs)."""
        workers = max(1, num_workers)
        return [sum(self.shares(epoch, Consumer(rank, world_size, w, workers))) for w in range(workers)]

    def start(self, epoch: int, resume: ResumeState | None, worker: int, num_workers: int) -> MixStart:
        """The schedule and per-source samplers of DataLoader worker ``worker`` (as ``EpochOrder.start``)."""
        first = self.first
        stream, skip = worker, 0
        if resume is not None and resume.epoch == epoch:
            origin, since = elastic_origin(resume, first.world_size, num_workers)
            if origin is not None:
                return self._start_elastic(epoch, origin, since, worker, num_workers)
            counts = self.rank_counts(epoch, first.rank, first.world_size, num_workers)
            stream, skip = resume_point(since, counts, worker, first.drop_last)
        consumer = Consumer(first.rank, first.world_size, stream, max(1, num_workers))
        shares = self.shares(epoch, consumer)
        schedule = self.schedule(epoch, consumer, shares)
        done = np.bincount(schedule[:skip], minlength=len(self.orders))
        parts = []
        for d, order in enumerate(self.orders):
            plan = order.plan(epoch, first.rank, stream, num_workers)
            sampler = self.sampler(d, plan, shares[d], epoch)
            sampler.skip(int(done[d]))
            parts.append((Part(plan, sampler, int(done[d])),))
        return MixStart(schedule[skip:], tuple(parts))

    # -- elastic resume -------------------------------------------------------------------------

    def consumed(self, epoch: int, origin: Origin) -> dict[tuple[int, int], np.ndarray]:
        """(rank, worker) of the interrupted run -> samples it had consumed of each source."""
        workers = max(1, origin.num_workers)
        out = {}
        for rank in range(origin.world_size):
            counts = self.rank_counts(epoch, rank, origin.world_size, origin.num_workers)
            for w in range(workers):
                consumer = Consumer(rank, origin.world_size, w, workers)
                skip = samples_to_skip(origin.segments(), counts, w, self.first.drop_last)
                out[rank, w] = interleaved_counts(
                    self.shares(epoch, consumer), self._schedule_rng(epoch, consumer), skip
                )
        return out

    def _cut(self, d: int, epoch: int, origin: Origin, done: dict[tuple[int, int], np.ndarray]) -> list[Cut]:
        """Where every interrupted consumer stood in source d (rank-major)."""
        order = self.orders[d]
        workers = max(1, origin.num_workers)
        old = [Consumer(r, origin.world_size, w, workers) for r in range(origin.world_size) for w in range(workers)]
        units = work_units(order.shards, len(old), seed=order.seed, epoch=epoch, shuffle=order.shuffle)
        cuts = []
        for c, mine in zip(old, units):
            frames = sum(s.frames for s in mine)
            k = int(done[c.rank, c.worker][d])
            current = frames - k % frames if frames and (k % frames or k == 0) else 0  # left of its pass
            cuts.append(Cut(tuple(mine), frames, current, self.shares(epoch, c)[d] - k))
        return cuts

    def prepare(self, resume: ResumeState) -> None:
        """Find, in the rank's process, where the interrupted run's consumers stood in each source when
        ``resume`` is elastic whatever this rank's worker count (``order.known_origin``): its DataLoader
        workers, forked later, inherit it (``_elastic_cut``) instead of each finding it again."""
        origin = known_origin(resume, self.first.world_size)
        if origin is not None:
            _elastic_cut(self, resume.epoch, origin)

    def _emitted(self, d: int, epoch: int, origin: Origin, done: dict[tuple[int, int], np.ndarray]) -> Emitted:
        """Source d's frames the interrupted run emitted this epoch (``elastic.emitted_frames``), from
        where each old consumer stood in it: its sampler's draws summarised by the compiled loop
        (``progress.consumer_progress``, its current pass), not replayed sample by sample; found once
        per source, whatever the groups and streams it is laid out for."""

        def drawn(old: Consumer, plan: ConsumerPlan) -> Drawn:
            return Drawn(
                self.sampler_rng(d, plan, epoch), int(done[old.rank, old.worker][d]), self.shares(epoch, old)[d]
            )

        return emitted_frames(self.orders[d].interrupted(epoch, origin), replay=drawn)

    def _current_passes(
        self,
        d: int,
        epoch: int,
        origin: Origin,
        done: dict[tuple[int, int], np.ndarray],
        emitted: Emitted,
        consumer: Consumer,
    ) -> list[ElasticPlan]:
        """Source d's frames left in the interrupted consumers' current passes, laid out for ``consumer``:
        first those of the consumers whose shares cover their pass (every frame, once), then those
        of the consumers whose shares end inside it (as many as they owe, each frame at most once);
        ``plan.num_samples`` is ``consumer``'s part."""
        order = self.orders[d]

        cuts = self._cut(d, epoch, origin, done)
        interrupted = order.interrupted(epoch, origin)
        plans = []
        for whole in (True, False):
            mine = [c for c in cuts if (c.owed >= c.current) == whole]
            count = sum(c.current if whole else c.owed for c in mine)
            elastic = order.plan_elastic(
                interrupted,
                consumer.worker,
                consumer.num_workers,
                emitted=emitted,
                only={e for c in mine for s in c.shards for e in s.episodes},
            )
            n = apportion(count, elastic.loads, consumer.index, order.equal_samples_per_rank) if count else 0
            plans.append(ElasticPlan(dataclasses.replace(elastic.plan, num_samples=n), elastic.frames))
        return plans

    def _rehome(
        self, sources: list[tuple[list[ElasticPlan], list[ConsumerPlan]]]
    ) -> list[tuple[list[ElasticPlan], list[ConsumerPlan]]]:
        """Equal-count mode gives every new consumer an equal part of each group of a source's frames
        (whole passes, partial ones, later passes), also of a group it holds no frame of. Such a part
        moves to the consumer's largest group of the same source, whose frames then repeat as equal
        mode repeats: the consumer's count of every source, and so the mixture's shares, stay. A
        consumer holding no frame of a source at all cannot be given its part (moving it to another
        source would change the mixture): ``_start_elastic`` refuses that resume."""
        out = []
        for now, later in sources:
            plans = [*(e.plan for e in now), *later]
            frames = [sum(p.lengths) for p in plans]
            homeless = sum(p.num_samples for p in plans if not p.lengths)
            if not homeless or not any(frames) or not all(o.equal_samples_per_rank for o in self.orders):
                out.append((now, later))
                continue
            counts = [p.num_samples if p.lengths else 0 for p in plans]
            counts[frames.index(max(frames))] += homeless
            out.append(
                (
                    [
                        ElasticPlan(dataclasses.replace(e.plan, num_samples=n), e.frames, e.loads)
                        for e, n in zip(now, counts)
                    ],
                    [dataclasses.replace(p, num_samples=n) for p, n in zip(later, counts[len(now) :])],
                )
            )
        return out

    def _later_passes(
        self, d: int, epoch: int, origin: Origin, done: dict[tuple[int, int], np.ndarray], consumer: Consumer
    ) -> list[ConsumerPlan]:
        """Source d's passes after the interrupted consumers' current ones, as each would have read
        them: pass j holds the frames of the old consumers whose shares reach into it (as many
        samples as they owe of it), laid out over the new consumers; ``consumer``'s plan of each
        (``num_samples``: its part)."""
        order = self.orders[d]
        beyond = [(c.shards, c.frames, max(0, c.owed - c.current)) for c in self._cut(d, epoch, origin, done)]
        plans: list[ConsumerPlan] = []
        for j in itertools.count():
            reach = [
                (mine, frames, min(frames, n - j * frames)) for mine, frames, n in beyond if frames and n > j * frames
            ]
            if not reach:
                return plans
            for whole in (True, False):  # as in the current passes: whole passes apart from partial ones
                group = [(mine, n) for mine, frames, n in reach if (n == frames) == whole]
                if not group:
                    continue
                split = split_shards(
                    [s for mine, _ in group for s in mine],
                    consumer.count,
                    seed=order.seed,
                    epoch=epoch,
                    shuffle=order.shuffle,
                )
                loads = [sum(s.frames for s in u) for u in split]
                mine = split[consumer.index]
                plans.append(
                    ConsumerPlan(
                        consumer=consumer,
                        episodes=tuple((s.index, e) for s in mine for e in s.episodes),
                        lengths=tuple(n for s in mine for n in s.lengths),
                        num_samples=apportion(
                            sum(n for _, n in group), loads, consumer.index, order.equal_samples_per_rank
                        ),
                        rank_samples=(),
                        warnings=(),
                    )
                )
        raise AssertionError("unreachable")

    def _start_elastic(self, epoch: int, origin: Origin, since: Segments, worker: int, num_workers: int) -> MixStart:
        """The rest of an epoch interrupted under ``origin``, for this rank's DataLoader worker ``worker``.

        As a single dataset's elastic resume, pass by pass: each source's frames left in the
        interrupted consumers' current passes (``_current_passes``) are laid out over the new
        consumers and read once each; a source whose share spans more passes (``repeat`` > 1, a
        weight above its size) then reads its following passes (``_later_passes``), each over the
        frames of the old consumers whose shares reach it. Every frame of a source then comes as
        many times as in the uninterrupted epoch, but for a last, partial pass's (as many samples,
        each frame at most once, other frames maybe).
        """
        first = self.first
        workers = max(1, num_workers)
        done, emitted = _elastic_cut(self, epoch, origin)

        def layout(stream: int) -> tuple[list[tuple[list[ElasticPlan], list[ConsumerPlan]]], tuple[int, ...]]:
            consumer = Consumer(first.rank, first.world_size, stream, workers)
            sources = self._rehome(
                [
                    (
                        self._current_passes(d, epoch, origin, done, emitted[d], consumer),
                        self._later_passes(d, epoch, origin, done, consumer),
                    )
                    for d in range(len(self.orders))
                ]
            )
            shares = tuple(
                sum(e.plan.num_samples for e in now) + sum(p.num_samples for p in later) for now, later in sources
            )
            return sources, shares

        sources, shares = layout(worker)
        stream, skip = worker, 0
        if any(b for b, _ in since):
            counts = [sum(layout(w)[1]) if w != worker else sum(shares) for w in range(workers)]
            stream, skip = resume_point(since, counts, worker, first.drop_last)
            if stream != worker:
                sources, shares = layout(stream)
        consumer = Consumer(first.rank, first.world_size, stream, workers)
        schedule = self.schedule(epoch, consumer, shares, elastic=True)
        skipped = np.bincount(schedule[:skip], minlength=len(self.orders))
        parts = []
        for d, ((now, later), order) in enumerate(zip(sources, self.orders)):
            owed = sum(p.num_samples for p in [*(e.plan for e in now), *later])
            if owed and not any(sum(p.lengths) for p in [*(e.plan for e in now), *later]):
                raise ValueError(
                    f"elastic resume in equal-count mode: mixture source {self.names[d] if self.names else d!r} "
                    f"owes this consumer {owed} samples but none of its frames; resume with fewer ranks or workers"
                )
            samplers: list[tuple[ConsumerPlan, PoolSampler | SubsetSampler]] = []
            for j, elastic in enumerate(now):
                seed = self.source_seed(d) + j  # below 2**63 + 1: a key part
                samplers.append(
                    (
                        elastic.plan,
                        SubsetSampler(elastic, order.pool_size, seed=seed, epoch=epoch, shuffle=order.shuffle),
                    )
                )
            for j, plan in enumerate(later):
                rng = keyed_rng(MIX_SAMPLER, first.seed, epoch, consumer.rank, consumer.worker + ELASTIC_FLAG, d, j)
                passes = PoolSampler(
                    plan.lengths, order.pool_size, rng, shuffle=order.shuffle, num_samples=plan.num_samples
                )
                samplers.append((plan, passes))
            left = int(skipped[d])
            source_parts = []
            for plan, sampler in samplers:
                n = min(left, sampler.num_samples)
                sampler.skip(n)
                left -= n
                source_parts.append(Part(plan, sampler, n))
            parts.append(tuple(source_parts))
        return MixStart(schedule[skip:], tuple(parts))


@functools.lru_cache(maxsize=1)
def _elastic_cut(
    order: MixtureOrder, epoch: int, origin: Origin
) -> tuple[dict[tuple[int, int], np.ndarray], list[Emitted]]:
    """Where every consumer of the run interrupted under ``origin`` stood in each source
    (``MixtureOrder.consumed``) and what each source had emitted (``MixtureOrder._emitted``): the
    last one of this process, so the rank computes it once before its DataLoader workers fork
    (``MixtureOrder.prepare``) and every worker, and every stream a worker lays out, reuses it."""
    done = order.consumed(epoch, origin)
    return done, [order._emitted(d, epoch, origin, done) for d in range(len(order.orders))]
