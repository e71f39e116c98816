"""``MixtureDataset``: one resumable stream over several robot datasets, mixed by weight, repeat or count.

Each source is an ``EpisodePoolDataset`` of its own (its episode pool, partition over ranks and
workers, windows at its own fps, storage options and episode subset); the mixture only decides,
per sample, which source's stream gives it (``mixture_order``: a pure schedule of (mixture, seed,
epoch, rank, worker)), and renames, zero-fills and pads the sources' keys into one sample shape
(``mixture_layout``). Resume follows from the schedule: a consumer's position gives each source's
position, and each source fast-forwards its own sampler; an epoch resumed under another layout
lays out what remains of each source again (``elastic.py``, per source). A resume state records
the mixture's identity (``mixture_digest``: sources, shares, subsets, key maps, epoch length and
each source's order) and a state of another mixture is refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ...cpus import cores_per_rank
from ...exceptions import LeRobotShardsError
from ...lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE
from ...storage import StorageLocation
from ..base import ResumableDataset
from ..dataset import EpisodePoolDataset, default_memory_budget
from ..meta import DatasetMeta, stats_to_numpy
from ..options import DecodeOptions, OrderOptions, ReadOptions, group_options
from ..plan.order import EpochOrder
from ..stats import StatSlot
from .layout import MixtureError, MixtureLayout, build_layout, mix_stats, rename_stats
from .order import MixStart, MixtureOrder
from .spec import Mixture, MixtureSource, is_mixture_file, load_mixture, source_counts

MIXTURE_DIGEST = "mixture_digest"
MIXTURE_COUNTS = "mixture_counts"

__all__ = ["Mixture", "MixtureDataset", "MixtureError", "MixtureResumeError", "MixtureSource", "load_mixture"]


class MixtureResumeError(LeRobotShardsError, ValueError):
    """A resume state saved by another mixture (or by a single dataset); the message says what differs."""


class MixtureDataset(ResumableDataset):
    """A PyTorch IterableDataset over a ``Mixture`` (or a mixture file: YAML or JSON, ``load_mixture``).

    Keywords as ``EpisodePoolDataset``'s (``delta_timestamps`` in seconds and in shared names, each
    source turning them into frames at its own fps; the ``order``/``read``/``decode`` groups or
    their flat keywords, for every source; a source's ``storage_options`` are laid over
    ``read``'s). Each sample is its source's sample under the shared keys, with
    ``dataset_index`` and ``dataset_name`` (``mixture_layout``: missing keys, padded vectors).
    ``cameras`` are shared names: each source decodes those it has (after its ``key_map``), a chosen
    camera a source lacks is a missing key (zeros and ``<key>_is_missing``), and a name no source
    has is refused (``MixtureError``).

    ``meta`` is the mixture's ``DatasetMeta``: shared features, and stats combined by the
    sources' shares of the epoch (``mixture_layout.mix_stats``); ``source_meta(name)`` is one
    source's own. ``samples_per_epoch`` counts the epoch's samples over every rank.
    """

    def __init__(
        self,
        mixture: Mixture | str | os.PathLike[str],
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        cameras: Sequence[str] | None = None,
        tolerance_s: float = 1e-4,
        rank: int | None = None,
        world_size: int | None = None,
        order: OrderOptions | None = None,
        read: ReadOptions | None = None,
        decode: DecodeOptions | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.mixture_file = None if isinstance(mixture, Mixture) else os.fspath(mixture)
        self.mixture = mixture if isinstance(mixture, Mixture) else load_mixture(mixture)
        order, read, decode = group_options(order, read, decode, options, caller="MixtureDataset()")
        if order.partition != "global":  # its sources' shares are laid out over all consumers (mixture_order)
            raise ValueError(
                f"MixtureDataset: partition={order.partition!r} is not supported for mixtures yet; use "
                f"partition='global' (a node's frame cache then misses in later epochs)"
            )
        # a consumer holds every source's pool at once: they share its memory budget evenly
        budget = read.memory_budget_bytes or default_memory_budget(None, cores_per_rank())
        read = dataclasses.replace(read, memory_budget_bytes=max(1 << 20, budget // len(self.mixture.sources)))
        self.sources = tuple(
            _open(spec, rank=rank, world_size=world_size, order=order, read=read, decode=decode)
            for spec in self.mixture.sources
        )
        self.names = self.mixture.names
        if cameras is not None:
            self._select_cameras(cameras)
        self._image_dtype = decode.image_dtype
        self.set_delta_timestamps(delta_timestamps, tolerance_s)
        try:
            counts = source_counts(self.mixture, [sum(s.frames for s in ds.epoch_order.shards) for ds in self.sources])
        except ValueError as e:
            raise MixtureError(f"mixture: {e}") from None
        self._order = MixtureOrder(tuple(ds.epoch_order for ds in self.sources), counts, self.names)
        first = self._order.first
        self.rank, self.world_size = first.rank, first.world_size
        self.digest = self.mixture.digest(counts, [o.key.digest() for o in self._order.orders])
        # The state's position and order fields, as a single dataset's (``checkpoint``), with the
        # mixture's identity standing for the shard plan.
        self._state_order = dataclasses.replace(first, shards=(), source_shards_digest=self.digest)

    def set_delta_timestamps(self, delta_timestamps: Mapping[str, Sequence[float]] | None, tolerance_s: float) -> None:
        """Set the windows (``delta_timestamps`` in seconds and shared names), before any iteration:
        for a caller that reads ``meta`` first to choose them (LeRobot's trainer), one open."""
        windows = {k: len(v) for k, v in (delta_timestamps or {}).items() if hasattr(v, "__len__")}
        layout = build_layout(
            self.names,
            [ds.features for ds in self.sources],
            [spec.key_map for spec in self.mixture.sources],
            windows,
            self._image_dtype,
            left_out=[_undecoded(ds) for ds in self.sources],
        )
        # In each source's own names, for the keys it has (the layout pads the others' windows);
        # every source checked before any is set, so that a refused call changes nothing.
        per_source = [
            {keys.source_key(k): v for k, v in (delta_timestamps or {}).items() if k not in keys.missing}
            for keys in layout.sources
        ]
        for ds, keys, mine in zip(self.sources, layout.sources, per_source):
            try:
                ds.frame_offsets(mine, tolerance_s)
            except ValueError as e:
                raise MixtureError(f"mixture source {keys.name!r} ({ds.fps:g} fps): {e}") from None
        for ds, mine in zip(self.sources, per_source):
            ds.set_delta_timestamps(mine, tolerance_s)
        self.layout: MixtureLayout = layout
        self._new_windows()

    def _select_cameras(self, cameras: Sequence[str]) -> None:
        """Narrow every source to the chosen shared camera names it has (``select_cameras``); a source
        lacking one gives it as a missing key (``mixture_layout``); a name no source has is refused."""
        if isinstance(cameras, (str, bytes)):
            raise TypeError(f"cameras must be a list of camera names, got {cameras!r}")
        offered = []  # each source's cameras: shared name -> its own
        for ds, spec in zip(self.sources, self.mixture.sources):
            shared = {source: name for name, source in spec.key_map.items()}
            offered.append({shared.get(c, c): c for c in ds.cameras})
        unknown = [c for c in cameras if not any(c in names for names in offered)]
        if unknown:
            every = sorted({c for names in offered for c in names})
            raise MixtureError(f"cameras {unknown}: no mixture source has them (the sources' cameras: {every})")
        for ds, names in zip(self.sources, offered):
            ds.select_cameras([names[c] for c in cameras if c in names])

    # -- what it holds --------------------------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        """Samples of each source per epoch (over every rank)."""
        return dict(zip(self.names, self._order.counts))

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        """The shared features (as ``EpisodePoolDataset.features``: what every sample holds)."""
        return self.layout.features

    @property
    def cameras(self) -> tuple[str, ...]:
        """The shared cameras every sample holds (zeros where its source lacks one), as ``EpisodePoolDataset``'s."""
        return tuple(k for k, v in self.features.items() if v["dtype"] == VIDEO_DTYPE)

    @property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.features.items() if v["dtype"] == IMAGE_DTYPE)

    @functools.cached_property
    def feature_stats(self) -> dict[str, Any]:
        """The sources' ``feature_stats`` (their ``meta/stats.json``) combined as ``meta.stats`` are, for
        ``DeviceFeeder(normalize=...)``: read off the sources' metadata without opening their
        episode tables (as ``EpisodePoolDataset.feature_stats``)."""
        stats = mix_stats(
            [
                rename_stats(stats_to_numpy(ds.feature_stats or {}), keys.rename)
                for ds, keys in zip(self.sources, self.layout.sources)
            ],
            self.weights,
        )
        return {k: v for k, v in stats.items() if k in self.layout.features}

    @property
    def decoded_bytes(self) -> int:
        """Bytes of every frame its sources decode (``EpisodePoolDataset.decoded_bytes``)."""
        return sum(ds.decoded_bytes for ds in self.sources)

    def set_frame_cache(self, directory: str | None, max_bytes: int | None = None) -> None:
        """Every source's decoded-frame cache in ``directory``, one bound for all (entries are keyed
        by content: the sources share the directory), before any iteration."""
        for ds in self.sources:
            ds.set_frame_cache(directory, max_bytes)

    @property
    def samples_per_epoch(self) -> int:
        return sum(self._order.counts)

    @property
    def num_frames(self) -> int:
        """Frames of the sources' chosen episodes, all together."""
        return sum(ds.num_frames for ds in self.sources)

    @property
    def num_episodes(self) -> int:
        return sum(ds.num_episodes for ds in self.sources)

    @property
    def fps(self) -> float:
        """The first source's fps (each source's windows are at its own: ``source(name).fps``)."""
        return self.sources[0].fps

    def source(self, name: str) -> EpisodePoolDataset:
        """One source's dataset, by its name."""
        if name not in self.names:
            raise KeyError(f"no mixture source named {name!r}; the sources are {list(self.names)}")
        return self.sources[self.names.index(name)]

    def source_meta(self, name: str) -> DatasetMeta:
        """One source's own metadata and stats (its own key names)."""
        return self.source(name).meta

    @property
    def weights(self) -> tuple[float, ...]:
        """Each source's share of the epoch's samples: what ``meta.stats`` weights the sources by."""
        total = self.samples_per_epoch
        return tuple(n / total if total else 0.0 for n in self._order.counts)

    @functools.cached_property
    def meta(self) -> DatasetMeta:
        """The mixture's metadata: shared features, stats by ``mix_stats`` (weights: ``weights``)."""
        metas = [ds.meta for ds in self.sources]
        stats = mix_stats(
            [rename_stats(m.stats, keys.rename) for m, keys in zip(metas, self.layout.sources)], self.weights
        )
        tasks = tuple(dict.fromkeys(t for m in metas for t in m.tasks))
        root = self.mixture_file or "mixture"
        return DatasetMeta(
            repo_id=os.path.splitext(os.path.basename(root))[0],
            root=root,
            info={"fps": self.fps, "mixture": self.counts, "features": self.layout.features},
            features=self.layout.features,
            stats={k: v for k, v in stats.items() if k in self.layout.features},
            tasks=tasks,
            episodes=(),
            total_episodes=sum(m.total_episodes for m in metas),
            total_frames=sum(m.total_frames for m in metas),
            fps=metas[0].fps,
            stats_source="mixture",
        )

    # -- epoch and resume -----------------------------------------------------------------------

    def _resume_order(self) -> EpochOrder:
        return self._state_order

    def state_dict(self, batches_consumed: int, batch_size: int) -> dict[str, Any]:
        """As ``EpisodePoolDataset.state_dict``, plus the mixture's identity and each source's count."""
        state = super().state_dict(batches_consumed, batch_size)
        return {**state, MIXTURE_DIGEST: self.digest, MIXTURE_COUNTS: self.counts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """As ``EpisodePoolDataset.load_state_dict``; a state of another mixture raises ``MixtureResumeError``."""
        if not isinstance(state, Mapping):
            raise ValueError(f"resume state must be a dict, got {type(state).__name__}")
        saved = state.get(MIXTURE_DIGEST)
        if saved is None:
            raise MixtureResumeError(
                f"resume state has no {MIXTURE_DIGEST}: it was saved by a single dataset, not by this mixture"
            )
        key = dataclasses.asdict(self._state_order.key)
        changed = [
            f"{k}={state[k]!r} (this mixture: {key[k]!r})" for k in _SETTINGS if k in state and state[k] != key[k]
        ]
        if changed:  # the digest would differ too: name the setting first
            raise MixtureResumeError(
                f"resume state was saved with {', '.join(changed)}: the samples would differ; resume with the "
                f"settings that saved it, or start a new epoch without the state"
            )
        if saved != self.digest:
            raise MixtureResumeError(
                f"resume state was saved by another mixture ({MIXTURE_DIGEST} {saved}, this one {self.digest}"
                f"{_differences(state.get(MIXTURE_COUNTS), self.counts)}): the samples would differ; resume "
                f"with the mixture that saved it, or start a new epoch without the state"
            )
        super().load_state_dict({k: v for k, v in state.items() if k not in (MIXTURE_DIGEST, MIXTURE_COUNTS)})
        if self._control.resume is not None:  # an elastic resume's cuts, found before the workers fork
            self._order.prepare(self._control.resume)

    def epoch_samples(self, num_workers: int) -> int:
        """Samples this rank yields this epoch with ``num_workers`` DataLoader workers."""
        return sum(self._order.rank_counts(self.epoch, self.rank, self.world_size, num_workers))

    def plan(self, worker: int, num_workers: int, epoch: int | None = None) -> MixStart:
        """This rank's worker's schedule and per-source samplers for ``epoch`` (default: the current one;
        pure; no I/O)."""
        return self._order.start(self.epoch if epoch is None else epoch, self._control.resume, worker, num_workers)

    # -- iteration ------------------------------------------------------------------------------

    def _name(self) -> str:
        return "mixture"

    def _iterate(
        self, worker: int, num_workers: int, epoch: int, stats: StatSlot, own: bool
    ) -> Iterator[dict[str, Any]]:
        began = time.perf_counter()
        start = self.plan(worker, num_workers, epoch)  # fast-forwards every source's sampler
        stats.reset()
        stats.add("fast_forward_samples", sum(p.skip for parts in start.parts for p in parts))
        stats.add("fast_forward_seconds", time.perf_counter() - began)
        return self._interleave(start, stats, epoch)

    def _interleave(self, start: MixStart, stats: StatSlot, epoch: int) -> Iterator[dict[str, Any]]:
        """The schedule's samples, each from its source's stream in turn. A stream that ends before
        the schedule does is a source that dropped samples (``on_error="skip"``: the epoch comes out
        shorter, counted as ``samples_skipped``) or a plan its source does not keep: an error, not
        a silently shorter epoch."""
        # Each source's stream opens its source (and reader thread) when first asked for a sample.
        streams = [
            _chain([ds.stream(*p, stats, epoch=epoch) for p in parts]) for ds, parts in zip(self.sources, start.parts)
        ]
        taken = [0] * len(streams)
        try:
            for d in start.schedule:  # numpy ints: a list of Python ints would cost 5x the memory
                item = next(streams[d], None)
                if item is not None:
                    taken[d] += 1
                    yield self.layout.sample(d, item)
                elif self.sources[d].read.on_error != "skip":
                    due = int(np.count_nonzero(start.schedule == d))
                    raise RuntimeError(
                        f"mixture source {self.names[d]!r} ({self.sources[d].source_url}): its samples ended after "
                        f"{taken[d]} of the {due} this consumer's schedule gives it: the source and the "
                        f"mixture's plan disagree (was the dataset changed while it was read?)"
                    )
        finally:
            for stream in streams:
                stream.close()  # type: ignore[attr-defined]


def _open(
    spec: MixtureSource,
    *,
    rank: int | None,
    world_size: int | None,
    order: OrderOptions,
    read: ReadOptions,
    decode: DecodeOptions,
) -> EpisodePoolDataset:
    """One source's dataset: the mixture's options (their storage options for remote sources only), its
    own storage options over them, resize's camera names translated."""
    if read.data_files_root is not None:
        raise MixtureError(
            "data_files_root is given per source in a mixture (MixtureSource.data_files_root), not for all of them"
        )
    data_files = spec.data_files_root
    assert data_files is None or isinstance(data_files, StorageLocation)  # made one by MixtureSource
    remote = "://" in spec.source and not spec.source.startswith("file://")
    storage = {**((remote and read.storage_options) or {}), **(spec.storage_options or {})} or None
    if decode.resize:
        resize = {spec.key_map.get(k, k): v for k, v in decode.resize_per_camera.items()}
        decode = dataclasses.replace(decode, resize=resize)
    try:
        return EpisodePoolDataset(
            spec.source,
            episodes=spec.episodes,
            rank=rank,
            world_size=world_size,
            order=order,
            read=dataclasses.replace(read, storage_options=storage, data_files_root=data_files),
            decode=decode,
        )
    except LeRobotShardsError:
        raise  # names its file already
    except ValueError as e:
        raise MixtureError(f"mixture source {spec.name!r}: {e}") from None


def _chain(streams: Sequence[Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """One source's streams read one after another (each opens its source when first asked); closing
    it closes every one."""
    try:
        for stream in streams:
            yield from stream
    finally:
        for stream in streams:
            stream.close()  # type: ignore[attr-defined]


def _undecoded(ds: EpisodePoolDataset) -> set[str]:
    """A source's cameras it does not decode: its samples never hold them."""
    return {k for k, v in ds.features.items() if v["dtype"] == VIDEO_DTYPE and k not in ds.cameras}


# The order settings a mixture's state records that are not the mixture's own (sources, shares).
_SETTINGS = ("seed", "shuffle", "episode_pool_size", "equal_samples_per_rank", "drop_last", "drop_n_last_frames")


def _differences(saved: Any, current: Mapping[str, int]) -> str:
    """What changed between the saved sources' counts and these, for the error's one line."""
    if not isinstance(saved, Mapping):
        return ""
    changes = [f"{k}: {saved.get(k, 'absent')} -> {current.get(k, 'absent')}" for k in {**saved, **current}]
    changed = [c for c, k in zip(changes, {**saved, **current}) if saved.get(k) != current.get(k)]
    return f"; samples per epoch {', '.join(changed)}" if changed else "; same counts, other sources or settings"


def open_dataset(source: str | os.PathLike[str], **kwargs: Any) -> EpisodePoolDataset | MixtureDataset:
    """A ``MixtureDataset`` for a mixture file (``.yaml``, ``.yml``, ``.json``), else an ``EpisodePoolDataset``."""
    if is_mixture_file(source):
        return MixtureDataset(source, **kwargs)
    return EpisodePoolDataset(os.fspath(source), **kwargs)
