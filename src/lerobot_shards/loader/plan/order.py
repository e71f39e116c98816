"""The resume state and the order it replays: what ``state_dict`` records, how ``load_state_dict``
checks it, and which plan and sampler an iterator of a (resumed) epoch starts from.

A state holds the position (``epoch``, ``batches_consumed``, ``batch_size``; after a resume
under another batch size, ``earlier_batches`` too: the epoch's batches of earlier sizes), the layout that
saved it (``world_size``, ``num_workers``; another one resumes elastically, ``elastic.py``), and
everything else that fixes the emission order (``OrderKey``: the order settings, the episode
subset, the shard or virtual-shard plan), each field by name plus a digest of them all. A state
is checked whole before anything is planned: types, ranges and relations (a checkpoint is
untrusted input: ``batches_consumed=4.9`` or a worker count of 10**7 is refused, not truncated or
replayed for minutes), its digest against its own fields (an edited state is refused), and every
order field against this dataset's, so a resume that would replay another order fails in one
line naming the setting. Keys a state lacks (older states, the minimal ``{epoch,
batches_consumed, batch_size}``) are not checked.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import numbers
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .elastic import ElasticPlan, Emitted, InterruptedEpoch, Origin, SubsetSampler, find_emitted, plan_elastic
from .partition import Consumer, ConsumerPlan, PlanOptions, ShardSpec, plan_consumer
from .resume import Segments, merge_segments, resume_point
from .sampling import PoolSampler, consumer_rng

# The version of the emission order (sampling.py) that resume states record: a state saved under
# another order would replay other samples, so it is refused. 2: pools fill gradually (FILL_EVERY).
SAMPLER_ORDER = 2
# Bounds of a state's layout: an elastic resume replays every consumer of the saving layout.
MAX_WORLD_SIZE = 1 << 16
MAX_WORKERS = 1024
# A resumed epoch's earlier batch sizes a state may hold (``ResumeState.earlier``, ``Origin.earlier``).
MAX_SEGMENTS = 32
MAX_CONSUMERS = 1 << 18
MAX_COUNT = 1 << 62  # epochs, batches, batch sizes: they live in a shared int64 array
DIGEST_CHARS = 16

POSITION = ("epoch", "batches_consumed", "batch_size")
LAYOUT = ("world_size", "num_workers")
ELASTIC = tuple(f"elastic_{k}" for k in ("world_size", "num_workers", "batches_consumed", "batch_size"))
# The epoch's batches of earlier batch sizes: since the elastic origin (or the epoch's start), and the origin's own.
EARLIER, ELASTIC_EARLIER = "earlier_batches", "elastic_earlier_batches"
ORDER_DIGEST = "order_digest"


@dataclass(frozen=True)
class ResumeState:
    """Where a resumed epoch starts: after ``batches_consumed`` batches of ``batch_size``."""

    epoch: int
    batches_consumed: int
    batch_size: int
    num_workers: int | None  # DataLoader workers of the run that saved it (None: not recorded)
    world_size: int | None = None  # ranks of the run that saved it (None: not recorded)
    origin: Origin | None = None  # saved inside an elastic-resumed epoch: the run that epoch resumed
    earlier: Segments = ()  # batches of earlier batch sizes since ``origin`` (or the epoch's start)

    def segments(self) -> Segments:
        """The batches consumed since ``origin`` (or the epoch's start) by batch size, in order."""
        since = self.batches_consumed - (self.origin.batches_consumed if self.origin is not None else 0)
        return (*self.earlier, (since - sum(b for b, _ in self.earlier), self.batch_size))


@dataclass(frozen=True)
class OrderKey:
    """Everything that fixes an epoch's emission order on every rank, as a resume state records it.

    The world size and worker count are not here: another layout resumes elastically.
    """

    seed: int
    shuffle: bool
    episode_pool_size: int
    equal_samples_per_rank: bool
    drop_last: bool
    sampler_order: int
    episodes_digest: str  # the episodes read (the ``episodes`` subset, or all of them)
    shard_plan_digest: str  # the source's shards: a converted dataset's, or a raw one's virtual plan
    drop_n_last_frames: int = 0
    # Nodes of a node-sticky partition, 1 for the global one: each node's part depends on it.
    nodes: int = 1

    def digest(self) -> str:
        """A digest of every field (a later one at the value states without it had left out, so
        their digests still match): equal digests, equal orders."""
        fields = dataclasses.asdict(self)
        for name, old in LATER_FIELDS.items():
            if fields[name] == old:
                del fields[name]
        return digest(fields)


# Order fields added after resume states were first written, with the value the order had before:
# a full state (one with an order digest) lacking one was saved with that value.
LATER_FIELDS: dict[str, Any] = {"drop_n_last_frames": 0, "nodes": 1}


# What to say about a field that changed, beyond its name and values.
_ORDER_HINTS = {
    "sampler_order": (
        " (a state saved by another lerobot-shards version: finish its epoch with that version, "
        "or start the next epoch here)"
    ),
    "episodes_digest": " (another episodes= subset)",
    "episode_pool_size": (
        " (memory_budget_bytes shrinks the pool when the episodes do not fit it, and its default follows the "
        "node's memory and cores: resume with the budget, or the pool size, of the run that saved it)"
    ),
    "drop_n_last_frames": " (another policy: its frames left unsampled at each episode's end)",
    "shard_plan_digest": (
        " (other shards: another conversion of the dataset, or a raw source's shard_bytes/episodes_per_shard)"
    ),
    "equal_samples_per_rank": (
        " (its default follows the world size: pass equal_samples_per_rank= explicitly to resume under another one)"
    ),
    "nodes": (
        " (partition='node' gives each node a fixed part of the dataset, which depends on the node count, "
        "world_size // LOCAL_WORLD_SIZE: resume on as many nodes, any number of ranks per node and workers, "
        "or start a new run)"
    ),
}


def digest(value: Any) -> str:
    """A short digest of a JSON-able value (sorted keys: the same value always gives the same text)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def shards_digest(shards: Sequence[ShardSpec]) -> str:
    """The digest of a shard plan: indices, episodes and their lengths, in plan order."""
    return digest([[s.index, list(s.episodes), list(s.lengths)] for s in shards])


def episodes_digest(shards: Sequence[ShardSpec]) -> str:
    """The digest of the episodes a (filtered) plan reads, whatever subset named them."""
    return digest(sorted(e for s in shards for e in s.episodes))


# -- checking a state (pure) ----------------------------------------------------------------------


def _int(state: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        raise ValueError(f"resume state: {key} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def check_count(name: str, value: Any, low: int) -> int:
    """``value`` as an int >= ``low`` (``state_dict``'s arguments), refusing floats and bools."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= MAX_COUNT:
        raise ValueError(f"{name} must be an int in [{low}, {MAX_COUNT}], got {value!r}")
    return int(value)


_INTS = {
    "epoch": (0, MAX_COUNT),
    "batches_consumed": (0, MAX_COUNT),
    "batch_size": (1, MAX_COUNT),
    "world_size": (1, MAX_WORLD_SIZE),
    "num_workers": (0, MAX_WORKERS),
    "elastic_world_size": (1, MAX_WORLD_SIZE),
    "elastic_num_workers": (0, MAX_WORKERS),
    "elastic_batches_consumed": (0, MAX_COUNT),
    "elastic_batch_size": (1, MAX_COUNT),
    "seed": (0, 2**64 - 1),
    "episode_pool_size": (1, MAX_COUNT),
    "sampler_order": (1, 1 << 30),
    "drop_n_last_frames": (0, MAX_COUNT),
    "nodes": (1, MAX_WORLD_SIZE),
}
_ORDER_FIELDS = {f.name: f.type for f in dataclasses.fields(OrderKey)}
KNOWN_KEYS = frozenset({*POSITION, *LAYOUT, *ELASTIC, EARLIER, ELASTIC_EARLIER, *_ORDER_FIELDS, ORDER_DIGEST})


@dataclass(frozen=True)
class SavedState:
    """A checked resume state: where to resume, and the order fields it recorded."""

    resume: ResumeState
    order: dict[str, Any]  # the OrderKey fields it has (all of them when it has a digest)
    order_digest: str | None


def parse_state(state: Mapping[str, Any]) -> SavedState:
    """Check a resume state whole (types, ranges, relations) and read it; one line naming the key."""
    if not isinstance(state, Mapping):
        raise ValueError(f"resume state must be a dict, got {type(state).__name__}")
    missing = [k for k in POSITION if k not in state]
    if missing:
        raise ValueError(f"resume state lacks {missing}: {dict(state)}")
    unknown = sorted(str(k) for k in state if k not in KNOWN_KEYS)
    if unknown:
        raise ValueError(f"resume state has unknown keys {unknown} (known: {sorted(KNOWN_KEYS)})")
    ints = {k: _int(state, k, *_INTS[k]) for k in _INTS if k in state}
    order: dict[str, Any] = {}
    for key, kind in _ORDER_FIELDS.items():
        if key not in state:
            continue
        value = state[key]
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"resume state: {key} must be True or False, got {value!r}")
        if kind == "str" and not _is_digest(value):
            raise ValueError(f"resume state: {key} must be a {DIGEST_CHARS}-character hex digest, got {value!r}")
        order[key] = ints.get(key, value)
    found = state.get(ORDER_DIGEST)
    if found is not None and not _is_digest(found):
        raise ValueError(f"resume state: {ORDER_DIGEST} must be a {DIGEST_CHARS}-character hex digest, got {found!r}")
    if found is not None:
        order = {**LATER_FIELDS, **order}
    if found is not None and set(_ORDER_FIELDS) - set(order):
        lacking = sorted(set(_ORDER_FIELDS) - set(order))
        raise ValueError(f"resume state has an {ORDER_DIGEST} but lacks {lacking}: it was edited or is damaged")
    elastic = [k for k in ELASTIC if k in ints]
    if elastic and len(elastic) != len(ELASTIC):
        raise ValueError(f"resume state has {elastic} but not {[k for k in ELASTIC if k not in ints]}: all or none")
    if elastic and not all(k in ints for k in LAYOUT):
        raise ValueError("resume state has elastic_* keys but lacks world_size or num_workers")
    if ELASTIC_EARLIER in state and not elastic:
        raise ValueError(f"resume state has {ELASTIC_EARLIER} but no elastic_* keys")
    origin = None
    if elastic:
        origin_batches, origin_size = ints["elastic_batches_consumed"], ints["elastic_batch_size"]
        earlier = _segments(state, ELASTIC_EARLIER, origin_batches, origin_size, "elastic_batches_consumed")
        values = [ints[k] for k in ELASTIC]
        origin = Origin(values[0], values[1], values[2], values[3], earlier=earlier)
    if origin is not None and origin.batches_consumed > ints["batches_consumed"]:
        raise ValueError(
            f"resume state: elastic_batches_consumed={origin.batches_consumed} is past "
            f"batches_consumed={ints['batches_consumed']} (both count from the epoch's start)"
        )
    since = ints["batches_consumed"] - (origin.batches_consumed if origin is not None else 0)
    earlier = _segments(state, EARLIER, since, ints["batch_size"], "batches_consumed")
    for world, workers in (("world_size", "num_workers"), ("elastic_world_size", "elastic_num_workers")):
        if world in ints and workers in ints and ints[world] * max(1, ints[workers]) > MAX_CONSUMERS:
            raise ValueError(
                f"resume state: {world}={ints[world]} x {workers}={ints[workers]} is more than "
                f"{MAX_CONSUMERS} consumers"
            )
    resume = ResumeState(
        epoch=ints["epoch"],
        batches_consumed=ints["batches_consumed"],
        batch_size=ints["batch_size"],
        num_workers=ints.get("num_workers"),
        world_size=ints.get("world_size"),
        origin=origin,
        earlier=earlier,
    )
    return SavedState(resume, order, found)


def _segments(state: Mapping[str, Any], key: str, batches: int, batch_size: int, total: str) -> Segments:
    """The ``[[batches, batch_size], ...]`` at ``key`` (``()`` when absent), checked: at most
    ``MAX_SEGMENTS``, each of at least one batch, no two neighbours (nor the last and
    ``batch_size``) of one size, together at most ``batches`` (the count ``total`` gives)."""
    if key not in state:
        return ()
    value = state[key]
    if not isinstance(value, (list, tuple)) or not 0 < len(value) <= MAX_SEGMENTS:
        raise ValueError(
            f"resume state: {key} must be a list of 1 to {MAX_SEGMENTS} [batches, batch_size], got {value!r}"
        )
    out: list[tuple[int, int]] = []
    for item in value:
        pair = dict(zip(("batches", "batch_size"), item)) if isinstance(item, (list, tuple)) and len(item) == 2 else {}
        if not pair:
            raise ValueError(f"resume state: {key} must hold [batches, batch_size] pairs, got {item!r}")
        b, size = _int(pair, "batches", 1, MAX_COUNT), _int(pair, "batch_size", 1, MAX_COUNT)
        if size == (out[-1][1] if out else None):
            raise ValueError(
                f"resume state: {key} has two neighbours of batch_size {size}: it was edited or is damaged"
            )
        out.append((b, size))
    if out[-1][1] == batch_size:
        raise ValueError(
            f"resume state: {key} ends with the batch size that follows it ({batch_size}): edited or damaged"
        )
    if sum(b for b, _ in out) > batches:
        raise ValueError(f"resume state: {key} holds more batches than {total} counts: it was edited or is damaged")
    return tuple(out)


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == DIGEST_CHARS and all(c in "0123456789abcdef" for c in value)


def check_order(saved: SavedState, key: OrderKey) -> None:
    """Refuse a state whose order fields differ from this dataset's, naming the first that does, or
    whose digest does not match its fields (they then equal this dataset's)."""
    current = dataclasses.asdict(key)
    for name, value in saved.order.items():
        if value != current[name]:
            raise ValueError(
                f"resume state was saved with {name}={value} but this dataset has {name}={current[name]}: "
                f"the sample order would differ{_ORDER_HINTS.get(name, '')}"
            )
    if saved.order_digest is not None and saved.order_digest != key.digest():  # its fields match: edited
        raise ValueError(
            f"resume state: {ORDER_DIGEST} {saved.order_digest} does not match its own order settings "
            f"({key.digest()}): it was edited or is damaged"
        )


# -- the order of an epoch, and where a (resumed) iterator starts (pure) --------------------------


class Start(NamedTuple):
    """Where one iterator starts: its consumer's plan and sampler, and the samples to fast-forward."""

    plan: ConsumerPlan
    sampler: PoolSampler | SubsetSampler
    skip: int


@dataclass(frozen=True)
class EpochOrder:
    """What fixes the order on this rank: the shards to read and the order settings (resolved)."""

    shards: tuple[ShardSpec, ...]  # the plan after the episode subset, as sampled (``partition.sampled_shards``)
    source_shards_digest: str  # the source's whole plan, before the subset
    seed: int
    shuffle: bool
    pool_size: int
    equal_samples_per_rank: bool
    drop_last: bool
    rank: int
    world_size: int
    drop_n_last_frames: int = 0  # what ``shards`` left out of each episode (recorded, not applied here)
    nodes: int = 1  # node-sticky partition over this many nodes (1: the global partition)

    @property
    def plan_options(self) -> PlanOptions:
        """The settings that shape every consumer's plan."""
        return PlanOptions(shuffle=self.shuffle, equal_samples_per_rank=self.equal_samples_per_rank, nodes=self.nodes)

    @functools.cached_property
    def key(self) -> OrderKey:
        """What a resume state records of this order (computed once: ``state_dict`` runs every step)."""
        return OrderKey(
            seed=self.seed,
            shuffle=self.shuffle,
            episode_pool_size=self.pool_size,
            equal_samples_per_rank=self.equal_samples_per_rank,
            drop_last=self.drop_last,
            sampler_order=SAMPLER_ORDER,
            episodes_digest=episodes_digest(self.shards),
            shard_plan_digest=self.source_shards_digest,
            drop_n_last_frames=self.drop_n_last_frames,
            nodes=self.nodes,
        )

    def plan(self, epoch: int, rank: int, worker: int, num_workers: int) -> ConsumerPlan:
        """A consumer's plan for ``epoch`` (``num_workers`` 0: one consumer per rank)."""
        consumer = Consumer(rank, self.world_size, worker, max(1, num_workers))
        return plan_consumer(self.shards, seed=self.seed, epoch=epoch, consumer=consumer, options=self.plan_options)

    def interrupted(self, epoch: int, origin: Origin) -> InterruptedEpoch:
        """``epoch`` of this order as the run interrupted under ``origin`` read it: what an elastic resume
        of it replays and lays out again (``elastic.InterruptedEpoch``), built once per resume."""
        return InterruptedEpoch(
            self.shards, self.seed, epoch, self.plan_options, self.pool_size, origin, self.drop_last
        )

    def plan_elastic(
        self,
        interrupted: InterruptedEpoch,
        worker: int,
        num_workers: int,
        *,
        emitted: Emitted | None = None,
        only: Collection[int] | None = None,
    ) -> ElasticPlan:
        """This rank's consumer's share of the rest of ``interrupted`` (``self.interrupted``; ``emitted``,
        ``only``: as ``elastic.plan_elastic``'s, for a mixture's source)."""
        consumer = Consumer(self.rank, self.world_size, worker, max(1, num_workers))
        return plan_elastic(interrupted, consumer=consumer, emitted=emitted, only=only)

    def prepare(self, resume: ResumeState) -> None:
        """Find, in the rank's process, where the interrupted run's consumers stopped when ``resume``
        is elastic whatever this rank's worker count (another world size, or a state saved inside an
        elastic epoch): its DataLoader workers, forked later, inherit it (``elastic.find_emitted``).
        Under the same world size only the worker count, unknown until the workers run, decides:
        each worker then finds it itself."""
        origin = known_origin(resume, self.world_size)
        if origin is not None:
            find_emitted(self.interrupted(resume.epoch, origin))

    def start(self, epoch: int, resume: ResumeState | None, worker: int, num_workers: int) -> Start:
        """The plan, sampler and fast-forward of DataLoader worker ``worker``.

        A resumed epoch may hand this worker another worker's stream: the DataLoader restarts
        its round-robin at worker 0, the interrupted run was mid-round (``resume.py``). Warns
        (from rank 0's worker 0) about idle or unbalanced consumers of a full plan.
        """
        stream, skip = worker, 0
        if resume is not None and resume.epoch == epoch:
            origin, since = elastic_origin(resume, self.world_size, num_workers)
            if origin is not None:
                interrupted = self.interrupted(epoch, origin)
                elastic = self.plan_elastic(interrupted, stream, num_workers)
                if any(b for b, _ in since):
                    counts = elastic.plan.rank_samples
                    stream, skip = resume_point(since, counts, worker, self.drop_last)
                    elastic = self.plan_elastic(interrupted, stream, num_workers)
                subset = SubsetSampler(elastic, self.pool_size, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
                return Start(elastic.plan, subset, skip)
            counts = self.plan(epoch, self.rank, worker, num_workers).rank_samples
            stream, skip = resume_point(since, counts, worker, self.drop_last)
        plan = self.plan(epoch, self.rank, stream, num_workers)
        if self.rank == 0 and stream == 0:
            for message in plan.warnings:
                warnings.warn(message, stacklevel=3)
        rng = consumer_rng(self.seed, epoch, self.rank, stream)
        sampler = PoolSampler(plan.lengths, self.pool_size, rng, shuffle=self.shuffle, num_samples=plan.num_samples)
        return Start(plan, sampler, skip)

    def state_dict(
        self, epoch: int, batches_consumed: int, batch_size: int, seen_workers: int | None, resume: ResumeState | None
    ) -> dict[str, Any]:
        """The resume state after ``batches_consumed`` batches of ``epoch`` (see the module's docstring)."""
        key = self.key
        state: dict[str, Any] = {
            "epoch": epoch,
            "batches_consumed": check_count("batches_consumed", batches_consumed, 0),
            "batch_size": check_count("batch_size", batch_size, 1),
            "world_size": self.world_size,
            **dataclasses.asdict(key),
            ORDER_DIGEST: key.digest(),
        }
        if resume is None or resume.epoch != epoch:
            if seen_workers is not None:
                state["num_workers"] = seen_workers
            return state
        # A resumed epoch (before this process iterated, under the layout that saved it): the batches
        # since the resume may be of another size, and the layout another one.
        workers = seen_workers if seen_workers is not None else resume.num_workers
        origin, since = (
            (None, resume.segments()) if workers is None else elastic_origin(resume, self.world_size, workers)
        )
        if workers is not None:
            state["num_workers"] = workers
        if origin is not None:  # this epoch is elastic: a later resume must rebuild it
            state.update({key: getattr(origin, key[len("elastic_") :]) for key in ELASTIC})
            if origin.earlier:
                state[ELASTIC_EARLIER] = [list(p) for p in origin.earlier]
        kept = since[:-1] if since and since[-1][1] == batch_size else since  # the same size goes on
        now = batches_consumed - (origin.batches_consumed if origin is not None else 0) - sum(b for b, _ in kept)
        if now < 0:
            raise ValueError(
                f"batches_consumed={batches_consumed} (batch_size={batch_size}) is before the position this epoch "
                f"was resumed at ({resume.batches_consumed} batches, the last {resume.batch_size} samples each): "
                f"count batches from the epoch's start, as the state's batches_consumed does"
            )
        position = merge_segments((*kept, (now, batch_size)))
        earlier = position[:-1] if position and position[-1][1] == batch_size else position
        if len(earlier) > MAX_SEGMENTS:
            raise ValueError(
                f"this epoch was resumed under {len(earlier) + 1} batch sizes; a resume state records at most "
                f"{MAX_SEGMENTS + 1}: resume it with the batch size it was saved with, or from an epoch boundary"
            )
        if earlier:
            state[EARLIER] = [list(p) for p in earlier]
        return state

    def load(self, state: Mapping[str, Any]) -> ResumeState:
        """The checked resume state (``parse_state``, ``check_order``); nothing is planned yet."""
        saved = parse_state(state)
        check_order(saved, self.key)
        resume = saved.resume
        if resume.num_workers is None and resume.world_size not in (None, self.world_size):
            # Another world size is resumed elastically, which needs the saved worker count.
            raise ValueError(
                f"resume state was saved with world_size={resume.world_size} but this dataset has "
                f"world_size={self.world_size}: the sample order would differ (a state saved before any iteration "
                f"ran records no num_workers, which an elastic resume needs)"
            )
        return resume


def known_origin(resume: ResumeState, world_size: int) -> Origin | None:
    """The run an epoch resumed on ``world_size`` ranks is finished elastically from, where the rank
    knows it before its DataLoader workers start (another world size, or a state saved inside an
    elastic epoch); None where it is not elastic, or where only the worker count, known once the
    workers run, would make it so."""
    if resume.origin is not None:
        return resume.origin
    if resume.world_size not in (None, world_size) and resume.num_workers is not None:
        return elastic_origin(resume, world_size, resume.num_workers)[0]
    return None


def elastic_origin(resume: ResumeState, world_size: int, num_workers: int) -> tuple[Origin | None, Segments]:
    """The run to finish the epoch of elastically (``None``: resume as is) and the batches since, by
    batch size (``resume.Segments``).

    A state saved under another layout starts an elastic epoch. A state saved inside an
    elastic-resumed epoch carries that epoch's origin: it resumes under the same layout as the
    run that saved it (its batches after the origin's are skipped on the elastic plan), never
    under a third one.
    """
    same = resume.world_size in (None, world_size) and (
        resume.num_workers is None or max(1, resume.num_workers) == max(1, num_workers)
    )
    if resume.origin is not None:
        if not same:
            raise ValueError(
                f"resume state was saved inside an epoch that was itself resumed under another layout, with "
                f"world_size={resume.world_size} and num_workers={resume.num_workers}; this run has "
                f"world_size={world_size} and num_workers={num_workers}: resume this epoch with the saving run's "
                f"layout (or from a checkpoint at an epoch boundary)"
            )
        return resume.origin, resume.segments()
    if same or resume.num_workers is None:
        _check_same_workers(resume, num_workers)
        return None, resume.segments()
    origin = Origin(
        resume.world_size or world_size,
        resume.num_workers,
        resume.batches_consumed,
        resume.batch_size,
        earlier=resume.earlier,
    )
    return origin, ()


def _check_same_workers(resume: ResumeState, num_workers: int) -> None:
    """Refuse a resume under another worker count: each worker's stream and skip would differ.

    num_workers 0 and 1 both make one stream per rank, so they may stand for each other.
    """
    if resume.num_workers is not None and max(1, resume.num_workers) != max(1, num_workers):
        raise ValueError(
            f"resume state was saved with DataLoader num_workers={resume.num_workers} but this DataLoader has "
            f"num_workers={num_workers}: the streams would differ (frames repeated and lost); resume with "
            f"num_workers={resume.num_workers}"
        )
