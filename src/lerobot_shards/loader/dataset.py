"""``EpisodePoolDataset``: stream whole shards into an episode pool, emit random frames, decode at emit.

Each (rank x worker) consumer gets a disjoint, frame-balanced set of whole shards per epoch
(``partition``), replays a deterministic pool order over their episodes (``sampling``), and
turns each emission into a sample shaped like ``LeRobotDataset.__getitem__`` (``emission``).
Resume is a fast-forward of that order on tables alone (``checkpoint``, ``resume``, ``elastic``):
no episode that was already used up is read again, and nothing is decoded until a sample is
emitted. This module only wires the pieces: the options (``options``), the source's metadata,
the order, the shared epoch and resume state, the emission loop.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import torch

from ..cpus import cores_per_rank
from ..cpus import local_world_size as launcher_local_world_size
from ..depth import DepthError, is_depth
from ..filesystems import protocols, resolve_source
from ..language import is_language_feature
from ..lerobot_v3 import IMAGE_DTYPE
from ..memory import node_memory_bytes
from ..resize import camera_sizes, resized_features
from ..storage import StorageLocation
from .augment import SampleTransforms
from .base import ResumableDataset
from .decoding.decoders import auto_decode_threads
from .decoding.frame_cache import resolve_options as resolve_frame_cache
from .emission import SampleLayout, stream_samples
from .meta import DatasetMeta, Stats, dataset_meta, episode_stats_rows
from .options import DecodeOptions, OrderOptions, ReadOptions, check_episodes, group_options
from .plan.budget import (
    OPEN_SHARDS,
    EpisodeTooLarge,
    MemoryNeeds,
    MemoryPlan,
    episode_held_bytes,
    fit_pool,
    sidecar_bytes,
)
from .plan.elastic import SubsetSampler
from .plan.order import EpochOrder, shards_digest
from .plan.partition import (
    Consumer,
    ConsumerPlan,
    PlanOptions,
    ShardSpec,
    filter_shards,
    sampled_shards,
    too_few_episodes,
)
from .plan.sampling import PoolSampler
from .plan.windows import delta_frame_offsets
from .read.remote import READ_AHEAD_CHUNKS
from .read.shard_cache import CHUNK_BYTES, default_cache_bytes
from .read.sources import EpisodeSource, ShardSource, SourceMetadata, open_source
from .stats import StatSlot

log = logging.getLogger(__name__)


class EpisodePoolDataset(ResumableDataset):
    """A PyTorch IterableDataset over a converted dataset or a raw LeRobot v3.0 dataset.

    Args:
        source: converted dataset (directory/URL holding ``manifest.json``, or the manifest
            itself) or raw LeRobot v3.0 dataset (directory/URL holding ``meta/info.json``).
        delta_timestamps: ``{key: [seconds, ...]}`` exactly as LeRobot's: windows of frames
            around each sample, clamped to the episode with ``<key>_is_pad`` flags.
        episodes: subset of episode indices (default all).
        cameras: subset of camera keys to decode (default all).
        tolerance_s: tolerance for ``delta_timestamps`` (LeRobot's default 1e-4 s).
        rank, world_size: each as given, else from torch.distributed, else ``RANK``/``WORLD_SIZE``, else 0/1.
        local_world_size: ranks per node, which ``partition="node"`` groups (as given, else
            ``LOCAL_WORLD_SIZE`` as torchrun sets it, else 1: every rank its own node).
        order: ``OrderOptions`` (pool size, seed, shuffle, equal counts per rank, drop_last).
        read: ``ReadOptions`` (storage options, cache, read-ahead, on_error, a raw source's
            virtual shards).
        decode: ``DecodeOptions`` (device, CUDA backend, threads, image dtype, resize).
        **options: the same options as flat keywords, named as the groups' fields
            (``seed=3``, ``cache_dir=...``, ``video_decode_device="cuda"``); a group and its
            own flat keywords together are refused. Each option is documented in ``options.py``.
        buffer_size: accepted and ignored (DeprecationWarning): the pool is counted in episodes,
            ``episode_pool_size``, not in frames.

    The options are checked when the dataset is built (one line naming the option), and
    kept resolved as ``order``, ``read`` and ``decode`` (``None`` defaults filled in); each is
    also readable by its name (``ds.seed``, ``ds.decode_threads``).

    ``meta`` (``loader.meta.DatasetMeta``) is what LeRobot's ``make_policy(cfg, ds_meta=...)``,
    ``make_pre_post_processors(..., dataset_stats=ds.meta.stats)`` and trainer read;
    ``num_frames`` and ``num_episodes`` count the chosen episodes, as ``LeRobotDataset``'s do.
    """

    order: OrderOptions
    read: ReadOptions
    decode: DecodeOptions

    def __init__(
        self,
        source: str,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | None = None,
        cameras: Sequence[str] | None = None,
        tolerance_s: float = 1e-4,
        rank: int | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
        order: OrderOptions | None = None,
        read: ReadOptions | None = None,
        decode: DecodeOptions | None = None,
        buffer_size: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if buffer_size is not None:
            warnings.warn(
                "EpisodePoolDataset(buffer_size=...) is deprecated and ignored: the pool holds whole episodes, "
                "set episode_pool_size (episodes resident per consumer) instead",
                DeprecationWarning,
                stacklevel=2,
            )
        order, read, decode = group_options(order, read, decode, options)
        # a Hub repo id becomes hf://datasets/<repo>@<commit> here, once: workers and resume states keep that
        self.source_url = resolve_source(str(source), read.revision, read.storage_options)
        self.rank, self.world_size = _distributed(rank, world_size)
        # DDP-safe default: unequal batch counts across ranks hang the first collective after
        # the shorter rank's epoch ended.
        if order.equal_samples_per_rank is None:
            order = dataclasses.replace(order, equal_samples_per_rank=self.world_size > 1)
        # Where the files are, built once: every source, worker and decoder opens them through it.
        self.location = StorageLocation(self.source_url, read.storage_options)
        read = dataclasses.replace(
            read,
            cache_max_bytes=default_cache_bytes(read.cache_dir)
            if read.cache_dir and read.cache_max_bytes is None
            else read.cache_max_bytes,
            prefetch_episodes=order.episode_pool_size if read.prefetch_episodes is None else read.prefetch_episodes,
        )
        self._episodes = check_episodes("episodes", episodes)
        self.order, self.read = order, read
        self._metadata: SourceMetadata | None = None
        meta = self._open_source()  # for its metadata only
        meta.close()
        # What every iterator (in this process or a DataLoader worker) opens the source from,
        # instead of fetching the manifest or the raw tables again.
        self._metadata = meta.metadata
        info = meta.info
        self.fps = info.fps
        self.tasks = info.tasks
        self.feature_stats = info.stats  # meta/stats.json, e.g. for DeviceFeeder(normalize=...)
        self._source_info = info  # for ``meta``, built when first asked for, and ``select_cameras``
        self._decode_given = resolve_frame_cache(decode)
        self.select_cameras(cameras)
        self.shards = self._select_shards(info.shards, episodes)
        assert order.equal_samples_per_rank is not None
        sampled = sampled_shards(self.shards, order.drop_n_last_frames)
        if not sampled:
            longest = max(n for s in self.shards for n in s.lengths)
            raise ValueError(
                f"{self.source_url}: drop_n_last_frames={order.drop_n_last_frames} leaves no frame to sample "
                f"(the longest chosen episode has {longest} frames)"
            )
        if order.equal_samples_per_rank and self.num_episodes < self.world_size:  # some rank would read none
            one = Consumer(self.rank, self.world_size, 0, 1)
            raise ValueError(f"{self.source_url}: {too_few_episodes(self.num_episodes, one)}")
        self.set_delta_timestamps(delta_timestamps, tolerance_s)
        # this rank's cores, counted here in the rank's process: a DataLoader worker cannot tell its
        # rank's launcher (a forkserver worker's parent is the fork server)
        self._rank_cores = cores_per_rank()
        # the pool and read-ahead the memory budget allows, from metadata alone: the order's pool size
        self.memory = self._memory_plan(local_world_size)
        self.read = dataclasses.replace(self.read, prefetch_episodes=self.memory.prefetch)
        self._order = EpochOrder(
            shards=tuple(sampled),
            source_shards_digest=shards_digest(info.shards),
            seed=order.seed,
            shuffle=order.shuffle,
            pool_size=self.memory.pool,
            equal_samples_per_rank=order.equal_samples_per_rank,
            drop_last=order.drop_last,
            rank=self.rank,
            world_size=self.world_size,
            drop_n_last_frames=order.drop_n_last_frames,
            nodes=_nodes(order.partition, self.world_size, local_world_size),
        )

    def select_cameras(self, cameras: Sequence[str] | None) -> None:
        """Choose the cameras to decode (``None``: all), before ``set_delta_timestamps`` and any iteration.

        A mixture (``loader.mix``) narrows each source's cameras once it knows which of the
        shared names the source has.
        """
        info = self._source_info
        if isinstance(cameras, (str, bytes)):  # iterating it would name each character as a camera
            raise ValueError(f"cameras must be a list of camera keys, got the string {cameras!r}; write [{cameras!r}]")
        if cameras is None:
            cameras = info.cameras
        unknown = sorted(set(cameras) - set(info.cameras))
        if unknown:
            raise ValueError(f"{self.source_url}: unknown cameras {unknown}; the dataset has {list(info.cameras)}")
        self.cameras = tuple(cameras)
        decode = self._decode_given
        if decode.decoder_cache_size is None:
            decode = dataclasses.replace(
                decode, decoder_cache_size=min(64, self.order.episode_pool_size * max(1, len(self.cameras)))
            )
        self.decode = decode
        try:  # depth cameras: dequantized with these (a bad field fails here, naming the camera)
            self.depth = {c: p for c, p in info.depth.items() if c in self.cameras}
        except DepthError as e:
            raise ValueError(f"{self.source_url}: {e}") from None
        self.resize_sizes = camera_sizes(decode.resize_per_camera, self.cameras, self.depth)
        self.features = resized_features(info.features, self.resize_sizes)
        self.image_keys = tuple(k for k, v in self.features.items() if v["dtype"] == IMAGE_DTYPE)

    def set_delta_timestamps(self, delta_timestamps: Mapping[str, Sequence[float]] | None, tolerance_s: float) -> None:
        """Set the windows (``delta_timestamps`` at this source's fps), before any iteration.

        A mixture (``loader.mix``) sets them once it knows each source's keys. Persistent
        workers started before keep their copy of the dataset: they refuse to iterate again.
        """
        self.delta_offsets = self.frame_offsets(delta_timestamps, tolerance_s)
        self._new_windows()
        self._layout = SampleLayout(
            source_url=self.source_url,
            tasks=tuple(self.tasks),
            cameras=self.cameras,
            image_keys=self.image_keys,
            delta_offsets=self.delta_offsets,
            resize_sizes=self.resize_sizes,
            image_dtype=self.decode.image_dtype,
            depth_cameras=frozenset(self.depth),
        )

    def frame_offsets(
        self, delta_timestamps: Mapping[str, Sequence[float]] | None, tolerance_s: float
    ) -> dict[str, np.ndarray]:
        """``delta_timestamps`` as frame offsets at this source's fps (``ValueError`` naming the key
        off the frame grid or unknown), without setting them."""
        windowed = [k for k in delta_timestamps or {} if is_language_feature(k, self.features.get(k, {}))]
        if windowed:
            raise ValueError(
                f"delta_timestamps[{windowed[0]!r}]: a language column is not windowed (LeRobot's dataset returns "
                "the frame's own annotation rows, and fails on a window of them)"
            )
        known = [k for k, v in self.features.items() if v["dtype"] != "video"] + list(self.cameras)
        return delta_frame_offsets(delta_timestamps or {}, self.fps, tolerance_s, known_keys=known)

    def _memory_plan(self, local_world_size: int | None) -> MemoryPlan:
        """The pool and read-ahead that fit ``memory_budget_bytes`` (``plan.budget``): what the chosen
        episodes, cameras, windows and decode threads are estimated to hold, from metadata."""
        info, read = self._source_info, self.read
        given = read.memory_budget_bytes
        budget = given if given is not None else default_memory_budget(local_world_size, self._rank_cores)
        chosen = [(e, n) for s in self.shards for e, n in zip(s.episodes, s.lengths)]
        row_values = sum(
            math.prod(v["shape"]) for k, v in self.features.items() if v["dtype"] not in ("video", IMAGE_DTYPE)
        )
        frames = [math.prod(self.features[c]["shape"]) for c in self.cameras]
        itemsize = torch.empty((), dtype=self.decode.image_dtype).element_size()
        threads = self.decode.decode_threads
        if threads is None:
            threads = auto_decode_threads(self.decode.video_decode_device, self._rank_cores)
        fixed = info.held_bytes + sidecar_bytes([s.frames for s in self.shards], len(info.cameras))
        if read.cache_dir is None and "file" not in protocols(
            self.location.fs
        ):  # the ranged reads' chunks, current and next shard
            fixed += OPEN_SHARDS * (READ_AHEAD_CHUNKS + 1) * CHUNK_BYTES
        needs = MemoryNeeds(
            episode_bytes=[
                episode_held_bytes(info.episode_bytes.get(e, 0), n, row_values, len(self.cameras)) for e, n in chosen
            ],
            frame_bytes=frames,
            sample_bytes=itemsize * sum(f * len(self.delta_offsets.get(c, (0,))) for c, f in zip(self.cameras, frames)),
            lookahead_samples=self.decode.decode_ahead or max(1, 2 * threads),
            decoder_cap=self.decode.decoder_cache_size,
            fixed_bytes=fixed,
        )
        assert read.prefetch_episodes is not None  # resolved in __init__
        try:
            plan = fit_pool(needs, budget, self.order.episode_pool_size, read.prefetch_episodes)
        except EpisodeTooLarge:
            largest = max(chosen, key=lambda en: info.episode_bytes.get(en[0], 0) + en[1])
            need = needs.cost(1, 1)
            message = (
                f"{self.source_url}: episode {largest[0]} ({largest[1]} frames, cameras {list(self.cameras)}) "
                f"needs about {need / 2**20:.0f} MiB with a pool of one episode and one read ahead, more than "
                f"memory_budget_bytes={budget} ({budget / 2**20:.0f} MiB per consumer"
                f"{'' if given is not None else ', the default for this node'}); "
                f"raise memory_budget_bytes, decode fewer cameras or smaller frames (resize)"
            )
            if given is not None:
                raise ValueError(message) from None
            warnings.warn(message + ": reading one episode at a time, over the budget", stacklevel=3)
            plan = MemoryPlan(budget, 1, 1, need, self.order.episode_pool_size, read.prefetch_episodes, needs)
        if plan.shrunk:
            log.info(
                "%s: memory_budget_bytes=%d per consumer: a pool of %d episodes (of %d) and %d read ahead (of %d), "
                "about %d MiB",
                self.source_url,
                budget,
                plan.pool,
                plan.asked_pool,
                plan.prefetch,
                plan.asked_prefetch,
                plan.estimate >> 20,
            )
        return plan

    @property
    def epoch_order(self) -> EpochOrder:
        """What fixes this rank's order (a mixture, ``loader.mix``, schedules its sources by it)."""
        return self._order

    # -- LeRobot-shaped metadata -----------------------------------------------------------------

    @property
    def num_frames(self) -> int:
        """Frames of the chosen episodes (``LeRobotDataset.num_frames``)."""
        return sum(sum(s.lengths) for s in self.shards)

    @property
    def num_episodes(self) -> int:
        """Number of chosen episodes (``LeRobotDataset.num_episodes``)."""
        return sum(len(s.episodes) for s in self.shards)

    @property
    def decoded_bytes(self) -> int:
        """Bytes of every frame of the chosen episodes and cameras, uint8 at the size the loader
        returns them: what a decoded-frame cache holding them all needs (``lerobot-shards train``
        sizes it so). Whole episodes: frames never sampled (``drop_n_last_frames``) are decoded too.
        Depth cameras are left out: the cache never holds them (``frame_cache.entry_key``)."""
        chosen = {e for s in self.shards for e in s.episodes}
        frames = sum(n for s in self._source_info.shards for e, n in zip(s.episodes, s.lengths) if e in chosen)
        return frames * sum(math.prod(self.features[c]["shape"]) for c in self.cameras if c not in self.depth)

    def set_frame_cache(self, directory: str | None, max_bytes: int | None = None) -> None:
        """Turn the decoded-frame cache on in ``directory``, at most ``max_bytes`` (``None``: as
        ``frame_cache_bytes``'s default), or off (``directory=None``), before any iteration: for a
        caller that sizes it by ``decoded_bytes`` once the dataset is open (``lerobot-shards train``)."""
        decode = dataclasses.replace(self._decode_given, frame_cache_dir=directory, frame_cache_bytes=max_bytes)
        self._decode_given = resolve_frame_cache(decode)
        self.select_cameras(self.cameras)

    @functools.cached_property
    def meta(self) -> DatasetMeta:
        """``LeRobotDatasetMetadata``-shaped metadata of the chosen episodes and cameras (``loader.meta``).

        Stats are aggregated from the chosen episodes' stats as LeRobot aggregates them: a raw
        source's meta/episodes rows, or over a subset of a converted dataset the stats its sidecars
        record (read then); a whole converted dataset has the source's ``meta/stats.json``.
        """
        info = self._source_info
        chosen = sorted(e for s in self.shards for e in s.episodes)
        everything = sum(len(s.episodes) for s in info.shards)
        per_episode = None
        if info.episode_stats is not None:
            table = info.episode_stats
            mask = pa.compute.is_in(table.column("episode_index"), value_set=pa.array(chosen, pa.int64()))
            per_episode = episode_stats_rows(table.filter(mask).to_pylist())
        elif len(chosen) < everything:
            per_episode = self._recorded_episode_stats(chosen)
        meta = dataset_meta(
            root=self.source_url,
            info=info.source_info,
            features=self.features,
            cameras=self.cameras,
            tasks=self.tasks,
            episodes=chosen,
            all_episodes=everything,
            all_frames=sum(sum(s.lengths) for s in info.shards),
            fps=self.fps,
            dataset_stats=info.stats,
            episode_stats=per_episode,
            depth={c: (p, self.decode.depth_output_unit) for c, p in self.depth.items()},
        )
        if meta.stats_source != "episodes" and len(chosen) < everything:
            warnings.warn(
                f"{self.source_url}: no per-episode stats for the chosen episodes; meta.stats is the dataset's "
                f"meta/stats.json, over all its episodes (a dataset converted before lerobot-shards recorded "
                f"episode stats: re-convert it for stats of the subset)",
                stacklevel=2,
            )
        return meta

    def episode_tasks(self) -> dict[int, tuple[str, ...]]:
        """The chosen episodes' tasks, each episode's in the order its metadata lists them (LeRobot's
        ``meta.episodes["tasks"]``: its eval split goes by the first): a raw source's meta/episodes,
        a converted episode's header (one small checked read each)."""
        source = self._open_source()
        try:
            return source.episode_tasks(sorted(e for s in self.shards for e in s.episodes))
        finally:
            if isinstance(source, ShardSource):
                source.close(wait=True)
            else:
                source.close()

    def _recorded_episode_stats(self, episodes: Sequence[int]) -> dict[int, Stats] | None:
        """A converted dataset's stats of ``episodes`` from its sidecars (None for a raw source)."""
        source = self._open_source()
        if not isinstance(source, ShardSource):
            source.close()
            return None
        try:
            return source.episode_stats(episodes)
        finally:  # no fetch thread may outlive it: DataLoader workers are forked after meta is read
            source.close(wait=True)

    def __getattr__(self, name: str) -> Any:
        """An option by its keyword name (``ds.seed``, ``ds.cache_dir``): the resolved value."""
        if not name.startswith("_"):
            for group in ("order", "read", "decode"):
                options = self.__dict__.get(group)
                if options is not None and name in options.__dataclass_fields__:
                    return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """The storage options sources and decoders open files with (the timeouts filled in)."""
        return dict(self.location.options) or None

    @property
    def _clips_location(self) -> StorageLocation:
        """Where decoders open a raw dataset's mp4s: its data files root when it has one."""
        root = self.read.data_files_root
        return root if isinstance(root, StorageLocation) else self.location

    def _open_source(self) -> EpisodeSource:
        return open_source(self.location, self.read, episodes=self._episodes, metadata=self._metadata)

    # -- configuration --------------------------------------------------------------------------

    def _select_shards(self, shards: list[ShardSpec], episodes: Sequence[int] | None) -> list[ShardSpec]:
        if episodes is None:
            return list(shards)
        wanted = set(int(e) for e in episodes)
        missing = sorted(wanted.difference(*(s.episodes for s in shards)))
        if missing:
            skipped = self._source_info.skipped
            why = "; ".join(f"episode {e} was skipped by convert: {skipped[e]}" for e in missing[:10] if e in skipped)
            raise ValueError(
                f"{self.source_url}: episodes {missing[:10]} are not in the dataset" + (f" ({why})" if why else "")
            )
        return filter_shards(shards, wanted)

    def _resume_order(self) -> EpochOrder:
        return self._order

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """``ResumableDataset.load_state_dict``; an elastic resume's summaries are found here, once per
        rank, before the DataLoader forks its workers (``EpochOrder.prepare``)."""
        super().load_state_dict(state)
        resume = self._control.resume
        if resume is not None:
            self._order.prepare(resume)

    # -- planning (pure) ------------------------------------------------------------------------

    @property
    def plan_options(self) -> PlanOptions:
        """The settings that shape every consumer's plan."""
        return self._order.plan_options

    def plan(self, rank: int, worker: int, num_workers: int) -> ConsumerPlan:
        """The consumer's episodes and sample counts for the current epoch; no I/O.

        Warns (once per rank, from worker 0) about idle or unbalanced consumers.
        """
        plan = self._order.plan(self.epoch, rank, worker, num_workers)
        if rank == 0 and worker == 0:
            for message in plan.warnings:
                warnings.warn(message, stacklevel=2)
        return plan

    def epoch_samples(self, num_workers: int) -> int:
        """Samples this rank yields this epoch with ``num_workers`` DataLoader workers."""
        return sum(self._order.plan(self.epoch, self.rank, 0, num_workers).rank_samples)

    # -- iteration ------------------------------------------------------------------------------

    def _name(self) -> str:
        return self.source_url

    def _iterate(
        self, worker: int, num_workers: int, epoch: int, stats: StatSlot, own: bool
    ) -> Iterator[dict[str, Any]]:
        plan, sampler, skip = self._order.start(epoch, self._control.resume, worker, num_workers)
        stats.reset()
        start = time.perf_counter()
        sampler.skip(skip)
        stats.add("fast_forward_samples", skip)
        stats.add("fast_forward_seconds", time.perf_counter() - start)
        # batched by the DataLoader as they come, with no wrapper between: frames may be staged
        return self.stream(plan, sampler, skip, stats, stage=own, epoch=epoch)

    def stream(
        self,
        plan: ConsumerPlan,
        sampler: PoolSampler | SubsetSampler,
        skip: int,
        stats: StatSlot,
        stage: bool = False,
        epoch: int = 0,
    ) -> Iterator[dict[str, Any]]:
        """The samples of ``sampler`` (fast-forwarded over ``skip``) on ``plan``'s episodes, read and
        decoded (``stage``: as ``stream_samples``'s, for the dataset's own iteration only), augmented
        for ``epoch`` when ``image_transforms`` is set."""
        transforms = self.decode.image_transforms
        keys = [k for k in (*self.cameras, *self.image_keys) if not is_depth(self.features[k])]
        return stream_samples(
            self._open_source,
            plan,
            sampler,
            skip,
            stats,
            layout=self._layout,
            read=self.read,
            decode=self.decode,
            location=self._clips_location,
            equal_samples_per_rank=self._order.equal_samples_per_rank,
            rank_cores=self._rank_cores,
            stage=stage,
            transforms=None if transforms is None else SampleTransforms(transforms, keys, self.order.seed, epoch),
        )


def default_memory_budget(local_world_size: int | None, rank_cores: int) -> int:
    """``memory_budget_bytes=None``: half the node's memory (its cgroup's limit, else MemTotal),
    shared by its ranks (as given, else as their launcher says, ``cpus.local_world_size``, else 1)
    and, in each rank, by one consumer per core (more DataLoader workers than cores: give the budget)."""
    found = launcher_local_world_size()
    ranks = local_world_size if local_world_size is not None else found[0] if found is not None else 1
    return max(1 << 20, node_memory_bytes() // 2 // (max(1, ranks) * max(1, rank_cores)))


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): each as given, else from ``torch.distributed`` once initialised, else
    from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets (0 and 1 without them)."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        found = {"rank": torch.distributed.get_rank(), "world_size": torch.distributed.get_world_size()}
    else:
        found = {"rank": _env_int("RANK", 0), "world_size": _env_int("WORLD_SIZE", 1)}
    r = int(rank) if rank is not None else found["rank"]
    w = int(world_size) if world_size is not None else found["world_size"]
    if not 0 <= r < w:
        given = ", ".join(
            f"{n}={v} ({'given' if a is not None else 'found'})"
            for n, v, a in (("rank", r, rank), ("world_size", w, world_size))
        )
        raise ValueError(
            f"rank must be in [0, world_size): {given}; pass both, or neither to use torch.distributed or RANK/WORLD_SIZE"
        )
    return r, w


def _nodes(partition: str, world_size: int, local_world_size: int | None) -> int:
    """Nodes of a node-sticky partition (1 for the global one): ``world_size // local_world_size``,
    the ranks per node as given, else as the launcher says (``cpus.local_world_size``: torchrun's
    ``LOCAL_WORLD_SIZE``, an srun task's SLURM variables), else 1."""
    if local_world_size is not None and (
        isinstance(local_world_size, bool) or not isinstance(local_world_size, numbers.Integral)
    ):
        raise ValueError(f"local_world_size must be an int, got {local_world_size!r}")
    if partition != "node":
        return 1
    found = (int(local_world_size), "given") if local_world_size is not None else launcher_local_world_size()
    local, told = found if found is not None else (1, "no LOCAL_WORLD_SIZE nor srun task")
    if local < 1 or world_size % local:
        raise ValueError(
            f"partition='node' groups ranks into nodes of local_world_size ranks, but {local} "
            f"({told}) does not divide world_size={world_size}"
        )
    return world_size // local


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None
