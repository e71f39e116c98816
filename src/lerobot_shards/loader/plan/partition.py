"""Which whole shards each (rank x worker) consumer reads in an epoch. Pure functions of metadata.

Whole shards per consumer keep reads sequential and make duplicates across ranks impossible;
balancing by frame count keeps consumers finishing together. When whole shards cannot keep
every consumer busy and balanced (fewer shards than consumers, or a few large ones),
``split_shards`` cuts the shard sequence into contiguous episode ranges instead (``work_units``
picks). ``plan_consumer`` is the one place that turns (shards, seed, epoch, consumer, options)
into a consumer's episodes and sample count.

A node-sticky plan (``PlanOptions.nodes`` > 1, ``partition="node"``) first splits the dataset
into one part per node, the same every epoch (``node_parts``), then lays each part out over its
node's consumers anew every epoch: a node-local decoded-frame cache then holds the frames its
node reads in every epoch, while the ranks of each node still see other episodes each epoch.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .sampling import PARTITION_STREAM, keyed_rng

SPLIT_STREAM = 0x5350_4C54  # "SPLT": the split's own random stream, apart from assign_shards'
NODE_STREAM = 0x4E4F_4445  # "NODE": salts the node split and each node's own layout


@dataclass(frozen=True)
class ShardSpec:
    """One shard of the plan as the loader sees it, real (converted) or virtual (raw source)."""

    index: int
    episodes: tuple[int, ...]
    lengths: tuple[int, ...]  # frames per episode, same order as ``episodes``

    def __post_init__(self) -> None:
        if len(self.episodes) != len(self.lengths):
            raise ValueError(
                f"shard {self.index}: {len(self.episodes)} episodes but {len(self.lengths)} episode lengths"
            )

    @property
    def frames(self) -> int:
        """Frames in the shard: what partitioning balances."""
        return sum(self.lengths)


def filter_shards(shards: Sequence[ShardSpec], episodes: set[int]) -> list[ShardSpec]:
    """Keep only the chosen episodes; shards left empty drop out (indices stay the plan's)."""
    out = []
    for s in shards:
        kept = [(e, n) for e, n in zip(s.episodes, s.lengths) if e in episodes]
        if kept:
            out.append(ShardSpec(s.index, tuple(e for e, _ in kept), tuple(n for _, n in kept)))
    return out


def sampled_shards(shards: Sequence[ShardSpec], drop_n_last_frames: int) -> list[ShardSpec]:
    """The frames each episode is sampled at: its first ``length - drop_n_last_frames`` (LeRobot's
    ``EpisodeAwareSampler``); an episode with none, and a shard left empty, drop out. Every plan
    and sampler works on these lengths, so no dropped frame is ever emitted, while the reader
    still holds whole episodes: a window reads past the sampled frames as context."""
    if not drop_n_last_frames:
        return list(shards)
    out = []
    for s in shards:
        kept = [(e, n - drop_n_last_frames) for e, n in zip(s.episodes, s.lengths) if n > drop_n_last_frames]
        if kept:
            out.append(ShardSpec(s.index, tuple(e for e, _ in kept), tuple(n for _, n in kept)))
    return out


@dataclass(frozen=True)
class Consumer:
    """One independent stream: a DataLoader worker on a rank (num_workers=0 counts as one)."""

    rank: int
    world_size: int
    worker: int
    num_workers: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.num_workers < 1:
            raise ValueError(
                f"num_workers must be at least 1 (use 1 for DataLoader num_workers=0), got {self.num_workers}"
            )
        if not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker must be in [0, {self.num_workers}), got {self.worker}")

    @property
    def index(self) -> int:
        """Position among all consumers (rank-major): the slot of its shards in an assignment."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        """Consumers over all ranks: how many ways the shards are split."""
        return self.world_size * self.num_workers


SIZE_BUCKETS = 20  # shards within 5% of the largest shard's size count as equal for balancing
SPLIT_TOLERANCE = 0.05  # whole shards are kept while no consumer holds more than 5% above the mean


def assign_shards(
    shard_frames: Sequence[int],
    num_consumers: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    salt: tuple[int, ...] = (),
) -> list[list[int]]:
    """Disjoint whole shards per consumer, every shard exactly once, balanced by frames.

    Greedy largest-first (LPT) list scheduling: each shard goes to the consumer with the fewest
    frames so far (ties by a permuted consumer priority, so no consumer always gets the extra
    shard). Sizes are compared in buckets of 1/``SIZE_BUCKETS`` of the largest shard, and shards
    within a bucket come in a (seed, epoch)-permuted order: balance stays close to exact LPT,
    while the near-equal shards a converter writes regroup every epoch, so a pool mixes
    different episodes each epoch. Each consumer then reads its shards in a (seed, epoch)-
    shuffled order. ``shuffle=False`` uses source order for ties and reading. ``salt`` (a node
    plan's) adds words to the random stream's key.
    """
    if num_consumers < 1:
        raise ValueError(f"num_consumers must be at least 1, got {num_consumers}")
    if any(f < 0 for f in shard_frames):
        raise ValueError("shard frame counts must be non-negative")
    rng = keyed_rng(PARTITION_STREAM, seed, epoch, *salt)
    n = len(shard_frames)
    order = [int(i) for i in rng.permutation(n)] if shuffle else list(range(n))
    bucket = max(1, max(shard_frames, default=0)) / SIZE_BUCKETS
    order.sort(key=lambda s: -int(shard_frames[s] / bucket))  # stable: a bucket keeps the permuted order
    consumers = range(num_consumers)
    priority = [int(p) for p in rng.permutation(num_consumers)] if shuffle else list(consumers)
    heap = [(0, priority[c], c) for c in consumers]
    heapq.heapify(heap)
    assignment: list[list[int]] = [[] for _ in range(num_consumers)]
    for shard in order:
        load, prio, c = heapq.heappop(heap)
        assignment[c].append(shard)
        heapq.heappush(heap, (load + shard_frames[shard], prio, c))
    if shuffle:
        return [[shards[int(i)] for i in rng.permutation(len(shards))] for shards in assignment]
    return [sorted(shards) for shards in assignment]


def consumer_frames(assignment: Sequence[Sequence[int]], shard_frames: Sequence[int]) -> list[int]:
    """Frames each consumer holds under ``assignment``."""
    return [sum(shard_frames[s] for s in shards) for shards in assignment]


def assignment_warnings(
    assignment: Sequence[Sequence[int]],
    shard_frames: Sequence[int],
    *,
    tolerance: float = 0.05,
    slack: int = 0,
    episode_lengths: Sequence[int] = (),
) -> list[str]:
    """Human-readable problems: idle consumers, and frame totals spread beyond ``tolerance``.

    A spread of at most ``slack`` frames is not reported (``plan_consumer`` passes the longest
    episode: no split of whole episodes can do better).

    Idle consumers waste workers; uneven totals leave the epoch's tail to fewer workers and,
    unless every consumer yields an equal count, give ranks different batch counts (DDP hangs).
    Each message names its cause: with ``episode_lengths`` (every episode of the plan), a spread
    within two episodes comes from whole episodes per consumer (few each), which smaller shards
    cannot change (the loader already cuts shards at episode boundaries, ``split_shards``): the
    remedy is fewer consumers.
    """
    frames = consumer_frames(assignment, shard_frames)
    messages: list[str] = []
    consumers = len(assignment)
    idle = sum(1 for shards in assignment if not shards)
    if idle and 0 < len(episode_lengths) < consumers:
        messages.append(
            f"{idle} of {consumers} consumers (ranks x workers) get no episode: {len(episode_lengths)} episodes for "
            f"{consumers} consumers, and an episode is never split between consumers; use at most "
            f"{len(episode_lengths)} consumers (fewer DataLoader workers)"
        )
    elif idle:
        messages.append(
            f"{idle} of {consumers} consumers (ranks x workers) get no shard: "
            f"{len(shard_frames)} shards for {consumers} consumers; write smaller shards "
            f"(at least one per consumer, ideally several) or use fewer DataLoader workers"
        )
    busy = [f for shards, f in zip(assignment, frames) if shards]
    if busy and max(busy) > 0:
        lo, hi = min(busy), max(busy)
        spread = (hi - lo) / (sum(busy) / len(busy))
        if spread > tolerance and hi - lo > slack:
            uneven = f"frames per consumer are uneven: min {lo}, max {hi} ({spread:.0%} of the mean)"
            if episode_lengths and hi - lo <= 2 * max(episode_lengths):
                n = len(episode_lengths)
                messages.append(
                    f"{uneven}: {n} episodes of {min(episode_lengths)}-{max(episode_lengths)} frames over "
                    f"{consumers} consumers (ranks x workers) are about {n / consumers:.1f} each, and an episode "
                    f"is never split between consumers; fewer DataLoader workers (more episodes each) balance better"
                )
            else:
                messages.append(f"{uneven}; smaller shards balance better")
    return messages


def equal_sample_count(assignment: Sequence[Sequence[int]], shard_frames: Sequence[int]) -> int:
    """Samples every consumer yields in equal-count mode: total frames // consumers.

    Equal counts per consumer give every worker the same number of batches, hence every rank
    too, so DDP never waits at epoch end for a rank with more batches. The price: a consumer
    holding more than the mean stops early and drops its unemitted frames this epoch (which ones
    varies with the shuffled order); one holding less starts another pass and repeats frames.
    The epoch's sample count falls short of its total frames by at most ``consumers - 1``.
    """
    frames = consumer_frames(assignment, shard_frames)
    idle = sum(1 for f in frames if f == 0)
    if idle:
        raise ValueError(
            f"equal-count mode needs frames on every consumer, but {idle} of {len(frames)} "
            f"have none; write smaller shards or use fewer DataLoader workers"
        )
    return sum(frames) // len(frames)


def too_few_episodes(episodes: int, consumer: Consumer) -> str:
    """Why equal counts cannot be given: fewer episodes than (rank x worker) consumers, so one would
    read none (an episode is never split between consumers), and what to change."""
    exact = "equal_samples_per_rank=False (every frame once; ranks may then run different batch counts)"
    fix = (
        f"{exact}, or fewer ranks"
        if episodes < consumer.world_size
        else f"at most {episodes // consumer.world_size} DataLoader workers per rank, or {exact}"
    )
    return (
        f"{episodes} episodes cannot give each of the {consumer.count} consumers ({consumer.world_size} ranks x "
        f"{consumer.num_workers} DataLoader workers, 1 for num_workers=0) at least one, which equal samples per "
        f"rank (the default with several ranks) needs: use {fix}"
    )


def split_shards(
    shards: Sequence[ShardSpec],
    num_consumers: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    salt: tuple[int, ...] = (),
) -> list[list[ShardSpec]]:
    """Contiguous episode ranges of the shard sequence per consumer: every episode exactly once.

    The shards are laid end to end (in a (seed, epoch)-permuted order, or source order without
    ``shuffle``), episodes keeping their order inside a shard, and the sequence is cut at the
    episode boundary nearest to each multiple of ``total_frames / num_consumers``. Each cut is
    within half an episode of its target, so every consumer holds the mean within one longest
    episode; with at least as many episodes as consumers, a cut that would leave a range empty
    moves by one episode (no consumer idles, none exceeds the mean by more than one episode). A consumer's range is returned as pieces of shards (``ShardSpec`` with the shard's
    index and a run of its episodes), so reads stay sequential and at most ``num_consumers - 1``
    shards are shared by two or more consumers. Which consumer gets which range is permuted per
    (seed, epoch) too, so no consumer always reads the shared boundaries.
    """
    if num_consumers < 1:
        raise ValueError(f"num_consumers must be at least 1, got {num_consumers}")
    rng = keyed_rng(SPLIT_STREAM, seed, epoch, *salt)
    order = [int(i) for i in rng.permutation(len(shards))] if shuffle else list(range(len(shards)))
    runs = [(shards[i].index, e, n) for i in order for e, n in zip(shards[i].episodes, shards[i].lengths)]
    bounds = [0, *itertools.accumulate(n for _, _, n in runs)]
    total = bounds[-1]
    cuts = [0]
    for k in range(1, num_consumers):
        target = k * total / num_consumers
        j = _nearest_boundary(bounds, target)
        if len(runs) >= num_consumers:  # enough episodes: none of the ranges is left empty
            j = min(max(j, cuts[-1] + 1), len(runs) - (num_consumers - k))
        cuts.append(max(j, cuts[-1]))
    cuts.append(len(runs))
    owner = [int(c) for c in rng.permutation(num_consumers)] if shuffle else list(range(num_consumers))
    out: list[list[ShardSpec]] = [[] for _ in range(num_consumers)]
    for part in range(num_consumers):
        for shard, group in itertools.groupby(runs[cuts[part] : cuts[part + 1]], key=lambda r: r[0]):
            items = list(group)
            out[owner[part]].append(ShardSpec(shard, tuple(e for _, e, _ in items), tuple(n for _, _, n in items)))
    return out


def _nearest_boundary(bounds: Sequence[int], target: float) -> int:
    """Index j of the prefix sum ``bounds[j]`` nearest to ``target`` (the lower one on a tie)."""
    lo, hi = 0, len(bounds) - 1
    while lo < hi:  # first j with bounds[j] >= target
        mid = (lo + hi) // 2
        if bounds[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    if lo > 0 and target - bounds[lo - 1] <= bounds[lo] - target:
        return lo - 1
    return lo


def work_units(
    shards: Sequence[ShardSpec],
    num_consumers: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    salt: tuple[int, ...] = (),
) -> list[list[ShardSpec]]:
    """Each consumer's shards (or pieces of shards) for ``epoch``: whole shards when they suffice.

    Whole shards (``assign_shards``) are kept when every consumer gets one and frame totals stay
    within ``SPLIT_TOLERANCE`` of the mean. Otherwise (fewer shards than consumers, or too few
    for balance, as a small dataset in one default-size shard read by several workers) the
    contiguous split (``split_shards``) is used if it lowers the heaviest consumer's frames,
    which is what decides when the epoch's tail ends.
    """
    shard_frames = [s.frames for s in shards]
    whole = [
        [shards[i] for i in mine]
        for mine in assign_shards(shard_frames, num_consumers, seed=seed, epoch=epoch, shuffle=shuffle, salt=salt)
    ]
    loads = [sum(s.frames for s in mine) for mine in whole]
    mean = sum(loads) / num_consumers
    if all(loads) and max(loads) <= mean * (1 + SPLIT_TOLERANCE):
        return whole
    split = split_shards(shards, num_consumers, seed=seed, epoch=epoch, shuffle=shuffle, salt=salt)
    if max(sum(s.frames for s in mine) for mine in split) < max(loads):
        return split
    return whole


@dataclass(frozen=True)
class PlanOptions:
    """The dataset settings that shape every consumer's plan."""

    shuffle: bool = True
    equal_samples_per_rank: bool = False  # every consumer yields total_frames // consumers samples
    # 1: one global partition, redrawn every epoch; N > 1: node-sticky, ranks grouped by
    # world_size // N into nodes (rank // ranks_per_node), each node reading its fixed part.
    nodes: int = 1


def ranks_per_node(world_size: int, nodes: int) -> int:
    """Ranks on each of ``nodes`` nodes; one line when ``world_size`` does not divide evenly."""
    if nodes < 1 or world_size % nodes:
        raise ValueError(
            f"a node-sticky partition needs world_size divisible by the node count: {world_size} ranks "
            f"on {nodes} nodes (LOCAL_WORLD_SIZE ranks per node)"
        )
    return world_size // nodes


def node_parts(shards: Sequence[ShardSpec], nodes: int, *, seed: int, shuffle: bool = True) -> list[list[ShardSpec]]:
    """Each node's part of the dataset: the same in every epoch (its key holds no epoch), balanced
    by frames (``work_units`` over nodes: whole shards, or contiguous episode ranges)."""
    if nodes == 1:
        return [list(shards)]
    return work_units(shards, nodes, seed=seed, epoch=0, shuffle=shuffle, salt=(NODE_STREAM,))


def node_layout(
    parts: Sequence[Sequence[ShardSpec]],
    per_node: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    layout: Callable[..., list[list[ShardSpec]]] = work_units,
) -> list[list[ShardSpec]]:
    """Every consumer's units (rank-major) when node ``n``'s ``per_node`` consumers share ``parts[n]``
    alone, laid out by ``layout`` with a (seed, epoch, node) stream: the ranks and workers of a
    node read other episodes each epoch, the node the same ones. One part: the global layout."""
    if len(parts) == 1:
        return layout(parts[0], per_node, seed=seed, epoch=epoch, shuffle=shuffle)
    units: list[list[ShardSpec]] = []
    for node, part in enumerate(parts):
        units += layout(part, per_node, seed=seed, epoch=epoch, shuffle=shuffle, salt=(NODE_STREAM, node))
    return units


@dataclass(frozen=True)
class ConsumerPlan:
    """Everything one consumer needs for one epoch, derived purely from the metadata."""

    consumer: Consumer
    episodes: tuple[tuple[int, int], ...]  # (shard index, episode index) in reading order
    lengths: tuple[int, ...]  # frames of each of those episodes
    num_samples: int  # this consumer's samples this epoch
    rank_samples: tuple[int, ...]  # samples of every worker of this consumer's rank (resume needs them all)
    warnings: tuple[str, ...]  # problems of the whole assignment (idle or unbalanced consumers)


def plan_consumer(
    shards: Sequence[ShardSpec], *, seed: int, epoch: int, consumer: Consumer, options: PlanOptions
) -> ConsumerPlan:
    """A consumer's episodes in reading order and its sample count for ``epoch``. No I/O.

    Every consumer computes the same assignment of all shards independently, so no coordination
    is needed across ranks or workers. With ``options.nodes`` > 1 each node's consumers share
    that node's fixed part (``node_parts``), laid out anew every epoch.
    """
    plans = plan_consumers(
        shards,
        seed=seed,
        epoch=epoch,
        world_size=consumer.world_size,
        num_workers=consumer.num_workers,
        options=options,
    )
    plan = plans[consumer.index]
    return dataclasses.replace(plan, warnings=tuple(plan_warnings(shards, plans)))


def plan_consumers(
    shards: Sequence[ShardSpec], *, seed: int, epoch: int, world_size: int, num_workers: int, options: PlanOptions
) -> list[ConsumerPlan]:
    """Every consumer's plan for ``epoch`` (rank-major, ``Consumer.index``) from one layout, without
    warnings: an elastic resume plans every old consumer, and one layout each would cost
    consumers x shards."""
    first = Consumer(0, world_size, 0, num_workers)
    per_node = ranks_per_node(world_size, options.nodes) * num_workers
    parts = node_parts(shards, options.nodes, seed=seed, shuffle=options.shuffle)
    units = node_layout(parts, per_node, seed=seed, epoch=epoch, shuffle=options.shuffle)
    loads = [sum(s.frames for s in mine) for mine in units]
    if options.equal_samples_per_rank:
        if not all(loads):
            fewest = min(sum(len(s.episodes) for s in part) for part in parts)
            if options.nodes > 1:
                raise ValueError(
                    f"a node-sticky partition gives each of {options.nodes} nodes a part of about "
                    f"{fewest} episodes, too few for its {per_node} consumers (ranks x DataLoader workers) in "
                    f"equal-count mode: use fewer DataLoader workers, partition='global', or "
                    f"equal_samples_per_rank=False"
                )
            raise ValueError(too_few_episodes(sum(len(s.episodes) for s in shards), first))
        counts = [sum(loads) // len(loads)] * len(loads)
    else:
        counts = loads
    return [
        ConsumerPlan(
            consumer=Consumer(index // num_workers, world_size, index % num_workers, num_workers),
            episodes=tuple((s.index, e) for s in mine for e in s.episodes),
            lengths=tuple(n for s in mine for n in s.lengths),
            num_samples=counts[index],
            rank_samples=tuple(counts[index - index % num_workers : index - index % num_workers + num_workers]),
            warnings=(),
        )
        for index, mine in enumerate(units)
    ]


def plan_warnings(shards: Sequence[ShardSpec], plans: Sequence[ConsumerPlan]) -> list[str]:
    """``assignment_warnings`` of every consumer's plan (idle or unbalanced consumers), its pieces of
    shards being the runs of one shard in its reading order."""
    assignment: list[list[int]] = []
    piece_frames: list[int] = []
    for plan in plans:
        mine = []
        for _, run in itertools.groupby(zip(plan.episodes, plan.lengths), key=lambda item: item[0][0]):
            mine.append(len(piece_frames))
            piece_frames.append(sum(n for _, n in run))
        assignment.append(mine)
    return assignment_warnings(
        assignment,
        piece_frames,
        slack=max((n for s in shards for n in s.lengths), default=0),
        episode_lengths=[n for s in shards for n in s.lengths],
    )
