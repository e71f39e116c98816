"""Where resident episodes come from: converted shards, or a raw LeRobot v3.0 dataset.

Both sources implement ``EpisodeSource``: they expose the same shard plan (the raw one applies
the converter's plan as virtual shards) and read one episode into a ``ResidentEpisode``: tables
as numpy arrays, video still encoded.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import logging
import os
import posixpath
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (see below)
import pyarrow.parquet as pq

from ... import format as fmt
from ...depth import DepthParams, depth_params
from ...episode_table import check_episode_table
from ...filesystems import protocols
from ...language import LanguageColumn, is_language_feature, language_column
from ...lerobot_v3 import (
    HEADER_BLOCK_BYTES,
    IMAGE_DTYPE,
    VIDEO_DTYPE,
    EpisodeMeta,
    LeRobotV3Source,
    SourceError,
    VideoRef,
    numpy_of,
)
from ...mp4cut import Mp4CutUnsupported, Mp4File
from ...names import check_name
from ...resize import feature_size
from ...safe_io import check_local_file, parse_sidecar, read_sidecar, read_small
from ...shard_plan import plan_shards
from ...storage import StorageLocation, as_location
from ...timeouts import bounded, open_bounded
from ..meta import Stats, stats_to_numpy
from ..options import ReadOptions
from ..plan.partition import ShardSpec
from .integrity import IntegrityError, check_episode_bytes
from .remote import LocalFile, Reader, RemoteFile, RemoteIO, close_when_open, ranged, reading, settled
from .shard_cache import CHUNK_BYTES, CachedFile, IOCounters, check_owned

log = logging.getLogger(__name__)
# Shards opened ahead of the reader, by size: the next one, and more while they fit in this many
# bytes. Each shard costs a round trip before its first byte, which small shards do not amortise.
READ_AHEAD_BYTES = CHUNK_BYTES
# pyarrow.compute is imported above, in the process that builds the dataset, on purpose: list
# columns' flatten() and casts import it lazily, and that first import inside forked DataLoader
# workers stalled each worker's first episode by ~2.3 s (measured: first batch from the bucket
# with 2 workers 3.1 s -> 0.96 s).


# A raw mp4's cut (no cache) reads at least this many bytes from where the episode starts, and keeps
# them (one window per file and consumer): the next episodes of a virtual shard, admitted one after
# another and stored one after another, are then cut from memory. Episodes of small frames cost one
# request per window instead of one each; an episode larger than the window is one request of its own.
CUT_WINDOW_BYTES = 4 << 20

MISSING = "missing, though manifest.json lists it: the dataset is incomplete; restore the file or re-convert"

# A rank reads a converted dataset's ``sidecars.pack`` whole, in one GET, when it is at most this
# big, and hands it to its DataLoader workers with the manifest: no consumer then fetches a sidecar,
# so a rank's metadata requests do not grow with its workers. 64 MiB holds the sidecars of about
# 15,000 one-camera episodes of 10 s with stats (~4 KiB each, measured on synthetic ones); a larger
# pack is not read (a rank would hold what its few shards never use): each consumer then reads its
# own shards' sidecar files, one request each, as before the pack.
PACK_WHOLE_BYTES = 64 << 20


@dataclass(frozen=True)
class ConvertedMetadata:
    """What a rank read of a converted dataset: the checked manifest and, when the conversion wrote
    one within ``PACK_WHOLE_BYTES``, ``sidecars.pack`` (checked against the manifest's sha256)."""

    manifest: fmt.Manifest
    pack: bytes | None = None


# What an open source read of its metadata, handed to ``open_source(metadata=...)`` to open the
# same source again without fetching it: a converted dataset's manifest and sidecars, a raw dataset's tables.
SourceMetadata = ConvertedMetadata | LeRobotV3Source


@dataclass(frozen=True)
class ClipRef:
    """An encoded clip a decoder can open: bytes of a cut clip, or a path/URL of a source mp4."""

    cache_key: str  # decoders are cached by this key
    data: bytes | None  # the clip itself (converted shards)
    url: str | None  # or a source mp4 (raw datasets), shared by the episodes it holds
    first_frame: int  # index of episode frame 0 inside the clip or mp4
    frame_mappings: str | None  # torchcodec custom_frame_mappings for exact seeks without a scan
    where: str = "clip"  # dataset, shard or file, episode and camera: decode errors name them
    size: tuple[int, int] | None = None  # (height, width) the camera's feature declares, checked at open
    depth: DepthParams | None = None  # a depth camera's quantizer: decoded by PyAV and dequantized


@dataclass
class ResidentEpisode:
    """One episode in the pool: tables decoded into numpy, video still encoded."""

    episode_index: int
    length: int
    columns: dict[str, np.ndarray | LanguageColumn]  # per tabular/image/language feature, first axis = frame
    clips: dict[str, ClipRef]  # per camera
    nbytes: int  # bytes read to load it
    release: Callable[[], None] | None = None  # call when it leaves the pool (frees its cached mp4s)


@dataclass
class SourceInfo:
    """What a source knows at open, before reading any episode: enough to plan every consumer."""

    fps: float
    features: dict[str, dict[str, Any]]
    cameras: tuple[str, ...]
    tasks: tuple[str, ...]
    shards: list[ShardSpec]
    stats: dict[str, Any]  # the source's meta/stats.json ({} when absent)
    source_info: dict[str, Any] = field(default_factory=dict)  # the source's meta/info.json
    episode_stats: pa.Table | None = None  # meta/episodes' stats/... columns (raw sources only)
    skipped: dict[int, str] = field(default_factory=dict)  # episodes convert left out: episode -> reason
    # What the source holds in memory, from metadata (``plan.budget``): per episode, the encoded
    # bytes of it kept while it is resident (a converted episode's members: its shard's bytes
    # spread over its episodes by frames; a raw episode's mp4s stay in their files: none), and
    # besides the episodes (a raw source's current data file).
    episode_bytes: dict[int, int] = field(default_factory=dict)
    held_bytes: int = 0

    @functools.cached_property
    def declared_sizes(self) -> dict[str, tuple[int, int] | None]:
        """Each camera's (height, width) as its feature declares it (``resize.feature_size``)."""
        return {cam: feature_size(self.features.get(cam, {})) for cam in self.cameras}

    @functools.cached_property
    def depth(self) -> dict[str, DepthParams]:
        """The depth cameras' parameters (``depth.depth_params``; ``DepthError`` naming a bad one)."""
        found = {cam: depth_params(self.features.get(cam, {}), f"camera {cam!r}") for cam in self.cameras}
        return {cam: p for cam, p in found.items() if p is not None}


def table_to_columns(
    table: pa.Table, features: dict[str, dict[str, Any]], where: str
) -> dict[str, np.ndarray | LanguageColumn]:
    """Parquet rows into per-feature numpy arrays; vectors become (N, D); language columns stay in Arrow."""
    out: dict[str, np.ndarray | LanguageColumn] = {}
    for name, spec in features.items():
        if spec["dtype"] == VIDEO_DTYPE:
            continue
        if name not in table.column_names:
            raise fmt.FormatError(f"{where}: feature {name!r} has no column (has {', '.join(table.column_names)})")
        col = table.column(name).combine_chunks()
        if is_language_feature(name, spec):
            out[name] = language_column(col, name, where, fmt.FormatError)
        elif spec["dtype"] == IMAGE_DTYPE:
            out[name] = np.array([v["bytes"] if isinstance(v, dict) else v for v in col.to_pylist()], dtype=object)
        elif pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            flat = numpy_of(col.flatten())
            out[name] = flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out[name] = np.array(col.to_pylist(), dtype=object)
        else:
            out[name] = numpy_of(col)
    return out


def checked_columns(
    table: pa.Table,
    info: SourceInfo,
    episode_index: int,
    length: int,
    where: str,
    error: type[Exception],
    episode_tasks: Sequence[str] = (),
) -> dict[str, np.ndarray | LanguageColumn]:
    """``table_to_columns`` of an episode's rows once they agree with the metadata (``check_episode_table``)."""
    check_episode_table(
        table,
        episode_index=episode_index,
        length=length,
        features=info.features,
        tasks=info.tasks,
        where=where,
        error=error,
        episode_tasks=episode_tasks,
        fps=info.fps,
    )
    return table_to_columns(table, info.features, where)


class EpisodeSource(Protocol):
    """The interface the loader reads episodes through (compare Grain's data sources).

    Lifecycle and threads: ``open_source`` opens one; ``info`` is read on open and immutable, so
    any thread may read it. ``read_episode`` and ``prefetch`` are called by one thread at a time
    (the loader's reader thread), never concurrently. ``close`` is called once, by whoever
    opened the source, after the last read; it releases open files and background downloads.
    A source never crosses processes: each DataLoader worker opens its own.
    """

    url: str
    info: SourceInfo
    metadata: SourceMetadata  # picklable: ``open_source(metadata=...)`` opens it again without fetching

    def read_episode(self, shard: int, episode_index: int) -> ResidentEpisode:
        """One episode of ``shard``: its tables decoded, its clips still encoded.

        Raises ``IntegrityError`` when its bytes do not match their checksum (after one re-fetch),
        and any other read failure as an error naming the shard or file and the episode.
        """
        ...

    def prefetch(self, shard: int) -> None:
        """Hint that ``shard`` is read soon: start fetching it in the background (may do nothing).

        On entering a shard the reader names the shards it reads after it, in order (a few): the
        first named is read next; a source may fetch the later ones too, or ignore them.
        """
        ...

    def episode_tasks(self, episodes: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """Each of ``episodes``' tasks in the order its metadata lists them (an eval split's key)."""
        ...

    def io_stats(self) -> dict[str, int]:
        """Bytes fetched from storage and cache hits/misses/evictions so far (``cache.COUNTERS``)."""
        ...

    def close(self) -> None:
        """Release files and background work; the source is not used afterwards."""
        ...


def open_source(
    where: StorageLocation | str,
    read: ReadOptions | None = None,
    *,
    episodes: Sequence[int] | None = None,
    metadata: SourceMetadata | None = None,
) -> EpisodeSource:
    """A converted dataset (has manifest.json) or a raw LeRobot v3.0 dataset (has meta/info.json).

    ``where``: the dataset's ``StorageLocation`` (the dataset's, built once), or a URL opened with
    ``read.storage_options``. ``read``: the read options, whole (the node cache, a raw dataset's
    virtual shards). ``episodes``: the subset that will be read; a raw dataset then needs only their
    files. ``metadata``: another open of the same source's ``metadata`` (picklable): nothing is
    fetched again, so DataLoader workers and later epochs reuse what the dataset read once.
    """
    read = read or ReadOptions()
    location = as_location(where, read.storage_options)
    with reading(location.url):
        return _open_source(location, read, episodes, metadata)


def _open_source(
    location: StorageLocation, read: ReadOptions, episodes: Sequence[int] | None, metadata: SourceMetadata | None
) -> EpisodeSource:
    if posixpath.basename(location.root.rstrip("/")) == fmt.MANIFEST_NAME:  # not a directory named x_manifest.json
        location = location.at(location.url.rstrip("/")[: -len(fmt.MANIFEST_NAME)].rstrip("/"))
    fs, path = location.fs, location.root
    if isinstance(metadata, ConvertedMetadata) or (
        metadata is None and bounded(fs, "exists", posixpath.join(path, fmt.MANIFEST_NAME))
    ):
        if read.data_files_root is not None:
            raise ValueError(
                f"{location.url}: a converted dataset holds its own files; data_files_root applies to a raw "
                "LeRobot v3.0 dataset only"
            )
        return ShardSource(location, read, metadata=metadata)
    if metadata is not None or bounded(fs, "exists", posixpath.join(path, "meta/info.json")):
        return RawSource(location, read, episodes=episodes, src=metadata)
    raise FileNotFoundError(
        f"{location.url}: neither a converted dataset ({fmt.MANIFEST_NAME}) nor a LeRobot v3.0 dataset (meta/info.json)"
    )


class ShardSource:
    """A converted dataset: manifest, per-shard sidecars, episodes read by byte range."""

    def __init__(
        self,
        where: StorageLocation | str,
        read: ReadOptions | None = None,
        *,
        metadata: ConvertedMetadata | None = None,
    ):
        read = read or ReadOptions()
        location = as_location(where, read.storage_options)
        self.url = location.url.rstrip("/")
        self.fs, self.root = location.fs, location.root
        self._local_root = self.root if "file" in protocols(self.fs) else None  # symlinks may not leave it
        where = posixpath.join(self.url, fmt.MANIFEST_NAME)
        # read_small: one GET (open().read() asks for the object's size first: two round trips)
        manifest_path = posixpath.join(self.root, fmt.MANIFEST_NAME)
        if metadata is None:
            manifest = fmt.Manifest.from_json(
                read_small(self.fs, manifest_path, fmt.MAX_MANIFEST_BYTES, root=self._local_root, where=where),
                where=where,
                legacy=read.legacy_format,
            )
            metadata = ConvertedMetadata(manifest, self._read_pack(manifest))
        self.manifest = metadata.manifest
        self.metadata: SourceMetadata = metadata
        self._pack = metadata.pack
        self._pack_offsets = fmt.pack_offsets(self.manifest) if self._pack is not None else {}
        m = self.manifest
        self._records = {s.index: s for s in m.shards}
        self._by_name = {s.name: s for s in m.shards}
        self._sidecars: dict[int, fmt.Sidecar] = {}
        self._entries: dict[int, tuple[int, fmt.EpisodeEntry]] = {}  # episode -> (shard, entry)
        self.counters = IOCounters()
        remote = "file" not in protocols(self.fs)
        self.remote = RemoteIO(self.url, read, self.counters) if remote else None
        self._readers: dict[int, Future[Reader]] = {}  # the shard being read and the prefetched next one
        self._current: int | None = None
        self._upcoming: list[int] = []  # the shards the reader named on entering the current one, in order
        self._named = False  # a read happened since: the next hint starts a new list
        self._opening: ThreadPoolExecutor | None = None
        self._sidecar_fetches: dict[int, Future[fmt.Sidecar]] = {}  # those of the shards read ahead
        self.info = SourceInfo(
            fps=m.fps,
            features=m.features,
            cameras=m.cameras,
            tasks=m.tasks,
            shards=[ShardSpec(s.index, s.episodes, self._episode_lengths(s)) for s in m.shards],
            stats=m.source_stats,
            source_info=m.source_info,
            skipped=dict(m.skipped_episodes),
            episode_bytes={
                e: -(-s.bytes * n // max(1, sum(lengths)))
                for s, lengths in ((s, self._episode_lengths(s)) for s in m.shards)
                for e, n in zip(s.episodes, lengths)
            },
        )

    def _read_pack(self, manifest: fmt.Manifest) -> bytes | None:
        """``sidecars.pack`` whole (one GET), checked against the manifest's sha256; None when the
        conversion wrote none, when it is over ``PACK_WHOLE_BYTES``, or when it is missing (an upload
        of an older version's did not send it: the sidecar files are read instead, said once)."""
        record = manifest.sidecar_pack
        if record is None or record.bytes > PACK_WHOLE_BYTES:
            return None
        where = f"{self.url}/{record.name}"
        try:
            data = read_small(
                self.fs, posixpath.join(self.root, record.name), record.bytes, root=self._local_root, where=where
            )
        except FileNotFoundError:
            log.warning("%s: missing, though manifest.json lists it; reading each shard's sidecar instead", where)
            return None
        if len(data) != record.bytes or fmt.sidecar_digest(data) != record.sha256:
            raise fmt.FormatError(
                f"{where}: does not match the size and sha256 the manifest records for it "
                f"({record.bytes} bytes, {record.sha256[:16]}...): edited or damaged after conversion; restore it "
                "or re-convert the dataset"
            )
        return data

    def _shard_path(self, name: str) -> str:
        return posixpath.join(self.root, fmt.SHARDS_DIR, check_name(name, f"{self.url}: shard name"))

    def sidecar(self, shard: int) -> fmt.Sidecar:
        """The shard's index (member offsets, clip frame tables), read once and kept (from its
        background fetch when one was started)."""
        if shard not in self._sidecars:
            fetching = self._sidecar_fetches.pop(shard, None)
            sc = fetching.result() if fetching is not None else self._read_sidecar(shard)
            self._sidecars[shard] = sc
            for e in sc.episodes:
                self._entries[e.episode_index] = (shard, e)
        return self._sidecars[shard]

    def _read_sidecar(self, shard: int) -> fmt.Sidecar:
        """Fetch and check the shard's sidecar (no shared state: may run on a background thread)."""
        rec = self._records[shard]
        path = self._shard_path(rec.sidecar)
        where = f"{self.url}/{fmt.SHARDS_DIR}/{rec.sidecar}"
        if self._pack is not None:  # its slice of the pack the rank read: no request
            start, end = self._pack_offsets[shard]
            assert self.manifest.sidecar_pack is not None
            at = f"{self.url}/{self.manifest.sidecar_pack.name} (bytes {start}..{end}), {where}"
            return parse_sidecar(self._pack[start:end], rec, self.manifest, where=at)
        try:
            sc, _ = read_sidecar(self.fs, path, rec, self.manifest, root=self._local_root, where=where)
        except FileNotFoundError:
            raise fmt.FormatError(f"{where}: {MISSING}") from None
        return sc

    def _sidecar_async(self, shard: int) -> None:
        """Start fetching the shard's sidecar: one small request, so its round trip overlaps the
        current shard's reads instead of stalling the reader when it enters the shard."""
        if self.remote is None or self._pack is not None or shard in self._sidecars or shard in self._sidecar_fetches:
            return
        self._sidecar_fetches[shard] = self.remote.pool.submit(self._read_sidecar, shard)

    def episode_stats(self, episodes: Sequence[int]) -> dict[int, Stats]:
        """The stats the sidecars record for ``episodes`` (one sidecar read per shard holding one of
        them, checked against the manifest's digest; from object storage several at a time, on the
        fetch threads); episodes converted without stats are left out."""
        wanted = set(episodes)
        shards = [rec.index for rec in self.manifest.shards if wanted.intersection(rec.episodes)]
        for shard in shards:
            self._sidecar_async(shard)
        out: dict[int, Stats] = {}
        for shard in shards:
            for e in self.sidecar(shard).episodes:
                if e.episode_index in wanted and e.stats:
                    out[e.episode_index] = stats_to_numpy(e.stats)
        return out

    def episode_tasks(self, episodes: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """Each episode's tasks as its header records them (meta/episodes' order, which LeRobot's
        eval split reads): the sidecars, then one small read of each header member, its checksum
        checked (from object storage several at a time, on the fetch threads)."""
        wanted = set(episodes)
        records = [rec for rec in self.manifest.shards if wanted.intersection(rec.episodes)]
        for rec in records:
            self._sidecar_async(rec.index)
        jobs = []
        local: list[LocalFile] = []
        try:
            for rec in records:
                where = f"{self.url}/{fmt.SHARDS_DIR}/{rec.name}"
                path = self._shard_path(rec.name)
                if self.remote is None:
                    local.append(LocalFile(check_local_file(path, root=self.root, where=where)))
                    fetch: Callable[[int, int], bytes] = local[-1].read
                else:
                    fetch = ranged(self.fs, path, where)
                for entry in self.sidecar(rec.index).episodes:
                    if entry.episode_index in wanted:
                        jobs.append((entry, fetch, f"{where}: episode {entry.episode_index}"))
            pool = self.remote.pool if self.remote is not None else None
            headers = list(pool.map(_read_header, jobs) if pool is not None else map(_read_header, jobs))
        finally:
            for f in local:
                f.close()
        return {entry.episode_index: header.tasks for (entry, _, _), header in zip(jobs, headers)}

    def _episode_lengths(self, rec: fmt.ShardRecord) -> tuple[int, ...]:
        if len(rec.episode_lengths) == len(rec.episodes):  # in the manifest: no sidecar read to plan
            return rec.episode_lengths
        lengths = {e.episode_index: e.length for e in self.sidecar(rec.index).episodes}  # an older manifest
        return tuple(lengths[e] for e in rec.episodes)

    def _open_reader(self, shard: int, after: Sequence[Future[bytes]] = ()) -> Reader:
        """The shard's bytes: the local file, the node cache (downloading it), or ranged reads.

        ``after``: a shard read ahead starts once the chunks then requested of the shard being read
        have landed: on a capped link its bytes would otherwise share the bandwidth with those the
        reader needs next (the pool's second episode, before the first batch)."""
        settled(list(after))
        rec = self._records[shard]
        path = self._shard_path(rec.name)
        where = f"{self.url}/{fmt.SHARDS_DIR}/{rec.name}"
        if self.remote is None:  # a shard symlinked out of the dataset is refused, as a FIFO would be
            try:
                return LocalFile(check_local_file(path, root=self.root, where=where))
            except FileNotFoundError:
                raise fmt.FormatError(f"{where}: {MISSING}") from None
        fetch = ranged(self.fs, path, where)
        if self.remote.cache is not None:
            cached = self.remote.cache.acquire(
                fetch,
                f"{self.remote.prefix}/{rec.name}",
                rec.bytes,
                rec.sha256,
                where,
                rehash=self.manifest.format_version < 2,
            )
            if cached is not None:
                return cached
        reader = RemoteFile(fetch, rec.bytes, self.remote.pool, self.remote.counters, chunk=CHUNK_BYTES)
        reader.start()
        return reader

    def _reader(self, shard: int) -> Reader:
        self._open_async(shard)
        if shard != self._current:  # left a shard: release every other one but those read ahead
            self._current = shard
            keep = {shard, *self._ahead()}
            for other in [k for k in self._readers if k not in keep]:
                close_when_open(self._readers.pop(other))
            # and its parsed sidecar (frame tables: ~235 B per frame and camera, an epoch's worth
            # otherwise); a shard read again (a later pass) fetches it again
            for other in [k for k in self._sidecars if k not in keep]:
                for e in self._sidecars.pop(other).episodes:
                    if self._entries.get(e.episode_index, (None,))[0] == other:
                        del self._entries[e.episode_index]
        return self._readers[shard].result()

    def _opener(self) -> ThreadPoolExecutor:
        if self._opening is None:  # acquiring may wait for another process's download: off the reader thread
            self._opening = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch-open")
        return self._opening

    def _open_async(self, shard: int, after: Sequence[Future[bytes]] = ()) -> None:
        if shard not in self._readers:
            self._readers[shard] = self._opener().submit(self._open_reader, shard, after)

    def prefetch(self, shard: int) -> None:
        """Read ``shard`` in the background (its download into the cache, or its first chunks) if it
        is among the shards read ahead (``_ahead``), once the first episode of the shard being
        entered has been served (the reader names the following shards first) and every chunk
        requested of that shard has landed: until then their bytes would share the bandwidth with
        the ones awaited. Its sidecar, a few kilobytes, is fetched at once: the round trip no longer
        stalls the reader when it enters the shard."""
        if self._named:  # the first hint since a read: the reader entered a shard
            self._upcoming, self._named = [], False
        if shard not in self._upcoming:
            self._upcoming.append(shard)
        if shard in self._ahead():
            self._sidecar_async(shard)

    def _ahead(self) -> list[int]:
        """The named shards read ahead: the first, and the next ones while within ``READ_AHEAD_BYTES``."""
        out: list[int] = []
        total = 0
        for shard in self._upcoming:
            total += self._records[shard].bytes
            if out and total > READ_AHEAD_BYTES:
                break
            out.append(shard)
        return out

    def io_stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    def close(self, wait: bool = False) -> None:
        """Release every shard (unfinished downloads are abandoned) and stop the background threads
        (with ``wait``, until they have exited: a source opened only to read metadata)."""
        for fut in self._readers.values():
            close_when_open(fut)
        self._readers.clear()
        if self._opening is not None:
            self._opening.shutdown(wait=False, cancel_futures=True)
            self._opening = None
        self._sidecar_fetches.clear()
        if self.remote is not None:
            self.remote.close(wait)

    def _drop(self, shard: int) -> None:
        """Forget what was read of ``shard``: its reader and, when cached, the local copy (fetched again)."""
        opening = self._readers.pop(shard, None)
        if opening is None:
            return
        reader = opening.result()
        if isinstance(reader, CachedFile):
            with contextlib.suppress(FileNotFoundError):
                os.remove(reader.path)
        reader.close()

    def _shard_end(self, shard: int) -> int:
        """Where the shard's last episode's members end."""
        return max(e.span()[1] for e in self.sidecar(shard).episodes)

    def _read_span(self, shard: int, entry: fmt.EpisodeEntry, where: str) -> bytes:
        """The episode's bytes, checked against the sidecar's member checksums."""
        start, end = entry.span()
        reader = self._reader(shard)
        if isinstance(reader, CachedFile) and self.manifest.format_version < 2:
            reader.wait()  # no member checksums: nothing is served before the whole shard is verified
        blob = reader.read(start, end)
        if isinstance(reader, CachedFile) and (reader.done.done() or end == self._shard_end(shard)):
            # A download that failed its sha256 is not the manifest's shard (bytes outside every
            # member differ): it raises here, and the episode is read again from a new download.
            # The shard's last episode waits for the check, so no shard is left unchecked.
            reader.wait()
        self._named = True
        pending = reader.requested() if isinstance(reader, RemoteFile) else []
        for ahead in self._ahead():  # what was awaited has landed: the next shards may start after the rest
            self._open_async(ahead, after=pending)
        if len(blob) != end - start:
            raise IntegrityError(f"{where}: shard is truncated (wanted bytes {start}..{end}, got {len(blob)})")
        check_episode_bytes(entry, blob, start, where)
        return blob

    def read_episode(self, shard: int, episode_index: int) -> ResidentEpisode:
        """One episode by a single ranged read of its members (or from the cached shard file),
        checked against the sidecar's checksums; on a mismatch read once more from the source."""
        where = f"{self.url}/{fmt.SHARDS_DIR}/{self._records[shard].name}: episode {episode_index}"
        with reading(where):  # timeouts and connection errors of any filesystem: say which shard
            return self._read_episode(shard, episode_index, where)

    def _read_episode(self, shard: int, episode_index: int, where: str) -> ResidentEpisode:
        if shard not in self._sidecars:  # a shard's first read: its bytes start coming while the sidecar does
            self._open_async(shard)
        self.sidecar(shard)
        shard_of, entry = self._entries[episode_index]
        start, _ = entry.span()
        try:
            blob = self._read_span(shard_of, entry, where)
        except IntegrityError as e:
            log.warning("%s; reading it again from the source", e)
            self._drop(shard_of)
            blob = self._read_span(shard_of, entry, where)  # a second mismatch is the caller's error

        def member(name: str) -> bytes:
            m = entry.members.get(name)
            if m is None:
                raise ValueError(f"{where}: member {name!r} missing from the sidecar")
            return blob[m.offset - start : m.offset - start + m.size]

        try:  # the episode's own header (inside the checksummed tar) must agree with sidecar and manifest
            header = fmt.EpisodeHeader.from_dict(json.loads(member(fmt.header_member(entry.key))))
            fmt.check_episode_header(header, entry, self.manifest)
        except (ValueError, KeyError, TypeError) as e:
            raise fmt.FormatError(
                f"{where}: {e if isinstance(e, fmt.FormatError) else f'unreadable header ({e!r})'}"
            ) from None
        try:
            table = pq.ParquetFile(io.BytesIO(member(fmt.table_member(entry.key)))).read()
        except (pa.ArrowException, OSError) as e:  # format 1 shards: bytes unchecked until here
            raise IntegrityError(
                f"{where}: member {fmt.table_member(entry.key)} is not readable parquet ({e})"
            ) from None
        columns = checked_columns(table, self.info, episode_index, entry.length, where, fmt.FormatError, header.tasks)
        clips = {
            cam: ClipRef(
                cache_key=f"{self.url}#{entry.key}.{cam}",
                data=member(fmt.clip_member(entry.key, cam)),
                url=None,
                first_frame=0,
                frame_mappings=clip.frame_mappings_json(),
                where=f"{where} camera {cam}",
                size=self.info.declared_sizes.get(cam),
                depth=self.info.depth.get(cam),
            )
            for cam, clip in entry.clips.items()
        }
        return ResidentEpisode(episode_index, entry.length, columns, clips, len(blob))


def _read_header(job: tuple[fmt.EpisodeEntry, Callable[[int, int], bytes], str]) -> fmt.EpisodeHeader:
    """An episode's header member alone, checked against the sidecar's checksum."""
    entry, fetch, where = job
    member = entry.members.get(fmt.header_member(entry.key))
    if member is None:
        raise fmt.FormatError(f"{where}: member {fmt.header_member(entry.key)!r} missing from the sidecar")
    data = fetch(member.offset, member.offset + member.size)
    if len(data) != member.size or (member.xxh3_128 is not None and fmt.member_checksum(data) != member.xxh3_128):
        raise IntegrityError(f"{where}: member {member.name} does not match its checksum")
    try:
        return fmt.EpisodeHeader.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as e:
        raise fmt.FormatError(f"{where}: unreadable header ({e!r})") from None


class RawSource:
    """A raw LeRobot v3.0 dataset read in place, split into the converter's plan as virtual shards.

    From object storage with a ``cache_dir`` (prefetch-on-admit): the mp4 files of the next
    virtual shard are downloaded into the node cache in the background, and an episode's files
    are held (reference-counted: v3 packs several episodes per file) until it leaves the pool, so
    decoders read local bytes. Released files stay in the cache, unpinned, until evicted LRU.

    From object storage without a cache: each camera's frames of the episode are cut out of its
    mp4 by bytes when the episode is read (``_cut``), so the reader thread fetches them ahead of the
    pool, as it fetches a converted episode; decoders then never wait on storage.
    """

    def __init__(
        self,
        where: StorageLocation | str,
        read: ReadOptions | None = None,
        *,
        episodes: Sequence[int] | None = None,
        src: LeRobotV3Source | None = None,
    ):
        read = read or ReadOptions()
        location = as_location(where, read.storage_options)
        self.url = location.url.rstrip("/")
        # With a subset, only its episodes' files must exist (as LeRobot downloads only those).
        if src is None:
            self.src = LeRobotV3Source(
                self.url, fs=location.fs, allow_missing_files=episodes is not None, data_files=read.data_files_root
            )
        else:  # its tables, with this process's filesystem (a forked worker may not use its parent's)
            self.src = copy.copy(src)
            self.src.fs = location.fs
        self.metadata: SourceMetadata = self.src
        if episodes is not None:
            known = {e.episode_index for e in self.src.episodes}
            missing = self.src.missing_files_for(e for e in episodes if e in known)
            if missing:
                listing = "; ".join(f"{p} (needed by episode {ep})" for p, ep in sorted(missing.items()))
                raise SourceError(
                    f"{self.src.data_url}: {len(missing)} missing file(s){self.src.data_files_note()} for the chosen "
                    f"episodes: {listing}"
                )
        if src is None:  # a given ``src`` was checked by the source that read it (a worker's parent)
            self._check_frames(episodes)
        plan = plan_shards(
            self.src.episode_sizes(), target_bytes=read.shard_bytes, episodes_per_shard=read.episodes_per_shard
        )
        # remote mp4s read without a cache are cut per episode when it is read (``_cut``)
        cuts = read.cache_dir is None and "file" not in protocols(self.src.data_fs)
        self.info = SourceInfo(
            fps=self.src.fps,
            features=self.src.features,
            cameras=self.src.camera_keys,
            tasks=self.src.tasks,
            shards=[
                ShardSpec(p.index, p.episodes, tuple(self.src.episode(e).length for e in p.episodes)) for p in plan
            ],
            stats=self.src.stats,
            source_info=self.src.info,
            episode_stats=self.src.episode_stats,
            # held while resident: an episode's cut clips where mp4s are cut (estimated from file sizes), else none
            episode_bytes={e.episode_index: e.est_bytes if cuts else 0 for e in self.src.episode_sizes()},
            held_bytes=max(
                (self.src.file_size(p) for p in {e.data_path for e in self.src.episodes} - set(self.src.missing_files)),
                default=0,
            ),
        )
        self.counters = IOCounters()
        self.remote = None
        if read.cache_dir is not None and "file" not in protocols(self.src.data_fs):
            check_owned(read.cache_dir, "cache_dir")  # its mp4s are checked against its own records only
            self.remote = RemoteIO(self.src.data_url, read, self.counters)  # the cache's names: the files' root
        self._files: dict[str, Future[CachedFile | None]] = {}  # mp4s downloading or held
        self._refs: dict[str, int] = {}  # resident episodes per held mp4
        self._lock = threading.Lock()  # episodes are released by the training thread
        self._opening: ThreadPoolExecutor | None = None
        self._next: int | None = None  # the virtual shard to prefetch after the next read
        self._cut_from = cuts
        # remote mp4s read without a cache: each one's sample tables (None: not cut, decoded from storage)
        self._mp4s: dict[str, Mp4File | None] = {}
        self._cutting: ThreadPoolExecutor | None = None  # their cuts' fetches, one thread per camera
        self._windows: dict[str, tuple[int, bytes]] = {}  # per remote mp4: the bytes last read, from offset

    def episode_tasks(self, episodes: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """Each episode's tasks as meta/episodes lists them (the order LeRobot's eval split reads)."""
        return {e: self.src.episode(e).tasks for e in episodes}

    def _check_frames(self, episodes: Sequence[int] | None) -> None:
        """Refuse, before any episode is read, an episode whose rows would take frames of another in a
        camera mp4 (``LeRobotV3Source.check_episode_frames``, from metadata alone; an fps or a
        from_timestamp that is not the files' shows this way). The checks that need the mp4s' headers
        run as each episode is read (``read_episode``)."""
        wanted = None if episodes is None else set(episodes)  # unknown ones are refused with the subset
        for e in self.src.episodes:
            if wanted is None or e.episode_index in wanted:
                self.src.check_episode_frames(e)

    def io_stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    def close(self) -> None:
        """Release every held mp4 (an unfinished download is abandoned) and stop the downloads."""
        with self._lock:
            for fut in self._files.values():
                close_when_open(fut)
            self._files.clear()
        if self._opening is not None:
            self._opening.shutdown(wait=False, cancel_futures=True)
        if self.remote is not None:
            self.remote.close()
        if self._cutting is not None:
            self._cutting.shutdown(wait=True, cancel_futures=True)  # before the files they read close
        for mp4 in self._mp4s.values():
            if mp4 is not None:
                mp4.close()
        self._mp4s.clear()
        self._windows.clear()

    def _mp4(self, rel: str) -> Mp4File | None:
        """A remote mp4's parsed sample tables (its start and moov read once per source), or None
        where ``mp4cut`` does not read the file or its frames are not in decode order (B-frames)."""
        if rel not in self._mp4s:
            handle = open_bounded(self.src.data_fs, self.src.data_path(rel), block_size=HEADER_BLOCK_BYTES)
            try:
                mp4: Mp4File | None = Mp4File(handle)
            except Mp4CutUnsupported:
                mp4 = None
            except BaseException:
                handle.close()
                raise
            if mp4 is None or mp4.track.composition_offset:
                handle.close()
                mp4 = None
            self._mp4s[rel] = mp4
        return self._mp4s[rel]

    def _cut(self, rel: str, first: int, length: int, where: str) -> tuple[bytes, int, str] | None:
        """Frames [first, first + length) of a remote mp4 as a standalone clip: its bytes, the index
        of frame ``first`` in it, and its torchcodec frame mappings. The clip starts at the keyframe
        at or before ``first`` and holds the samples byte for byte (``mp4cut``), so a decoder gives
        the frames a seek in the whole file gives. Its bytes come from the file's window (``_bytes``).
        None where the file is not cut (``_mp4``).

        Why: a decoder reading the remote file itself fetches blocks when a sample first needs
        them, in the decode thread, so every sample behind it waited out a round trip."""
        mp4 = self._mp4(rel)
        if mp4 is None:
            return None
        keys = np.flatnonzero(mp4.track.sync[: first + 1])
        if len(keys) == 0:
            return None
        start = int(keys[-1])
        try:
            layout = mp4.layout(start, first + length - start)
        except (Mp4CutUnsupported, ValueError):  # not cut: the decoder reports the file its own way
            return None
        parts = [layout.prefix, *(self._bytes(rel, offset, size, where) for offset, size in layout.ranges)]
        frames = [
            {"pts": int(p), "duration": int(d), "key_frame": int(k)}
            for p, d, k in zip(layout.pts.tolist(), layout.durations.tolist(), layout.sync.tolist())
        ]
        return b"".join(parts), first - start, json.dumps({"frames": frames})

    def _bytes(self, rel: str, offset: int, size: int, where: str) -> bytes:
        """``size`` bytes of a remote mp4 at ``offset``: from its window when there, else one ranged
        read of at least ``CUT_WINDOW_BYTES`` (within the file), kept as its window."""
        window = self._windows.get(rel)
        if window is not None and window[0] <= offset and offset + size <= window[0] + len(window[1]):
            return window[1][offset - window[0] : offset - window[0] + size]
        end = max(offset + size, min(offset + CUT_WINDOW_BYTES, self.src.file_size(rel)))
        data = ranged(self.src.data_fs, self.src.data_path(rel), where)(offset, end)
        if len(data) != end - offset:
            raise OSError(f"{where}: storage returned {len(data)} bytes of {end - offset} at byte {offset}")
        self._windows[rel] = (offset, data)
        return data[:size]

    def _video_files(self, episode_index: int) -> list[str]:
        return [v.path for v in self.src.episode(episode_index).videos.values()]

    def _hold(self, rel: str) -> Future[CachedFile | None]:
        """Start (or join) the download of one mp4 into the cache; caller holds ``_lock``."""
        if rel not in self._files:
            if self._opening is None:
                self._opening = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch-open")
            self._files[rel] = self._opening.submit(self._acquire, rel)
            self._refs.setdefault(rel, 0)
        return self._files[rel]

    def _acquire(self, rel: str) -> CachedFile | None:
        assert self.remote is not None and self.remote.cache is not None
        where = f"{self.src.data_url}/{rel}"
        fetch = ranged(self.src.data_fs, self.src.data_path(rel), where)
        return self.remote.cache.acquire(fetch, f"{self.remote.prefix}/{rel}", self.src.file_size(rel), None, where)

    def prefetch(self, shard: int) -> None:
        """Download the mp4s of the virtual shard ``shard`` in the background, queued after those of
        the episode read next, if it is the first shard named since the last read (the one read
        next; later ones would hold more mp4s in the cache); nothing without a cache."""
        if self._next is None:
            self._next = shard

    def _start_prefetch(self) -> None:
        if self._next is None:
            return
        spec = next(s for s in self.info.shards if s.index == self._next)
        self._next = None
        with self._lock:
            for e in spec.episodes:
                for rel in self._video_files(e):
                    self._hold(rel)

    def _release(self, files: list[str]) -> None:
        with self._lock:
            for rel in files:
                self._refs[rel] -= 1
                if self._refs[rel] == 0 and rel in self._files:
                    del self._refs[rel]
                    close_when_open(self._files.pop(rel))

    def _hold_videos(self, episode_index: int) -> dict[str, Future[CachedFile | None]]:
        """The episode's mp4s by path, downloading into the cache (or already there), counted as held
        by the episode; the next virtual shard's are queued after them. {} without a cache."""
        if self.remote is None:
            return {}
        with self._lock:
            held = {rel: self._hold(rel) for rel in self._video_files(episode_index)}
            for rel in held:
                self._refs[rel] += 1
        self._start_prefetch()
        return held

    def _local_videos(self, held: dict[str, Future[CachedFile | None]], episode_index: int) -> dict[str, str]:
        """Local paths of the held mp4s once downloaded; a failure names the file and the episode."""
        local = {}
        for rel, opening in held.items():
            with reading(f"{self.src.data_url}/{rel}: episode {episode_index}"):
                cached = opening.result()
                if cached is not None:  # does not fit in the cache: decoded from storage
                    local[rel] = cached.wait()
        return local

    def _start_cuts(self, ep: EpisodeMeta, where: str) -> dict[str, Future[tuple[bytes, int, str] | None]]:
        """Each camera's ``_cut`` of the episode, fetched on threads of their own (one per camera: each
        is a round trip or two); {} where mp4s are not cut (local, or read through the cache)."""
        if not self._cut_from:
            return {}
        if self._cutting is None:
            self._cutting = ThreadPoolExecutor(len(ep.videos) or 1, thread_name_prefix="mp4-cut")

        def cut(cam: str, v: VideoRef) -> tuple[bytes, int, str] | None:
            with reading(f"{self.src.data_url}/{v.path}: episode {ep.episode_index} camera {cam}"):
                return self._cut(v.path, v.first_frame(self.src.fps), ep.length, f"{where} camera {cam} ({v.path})")

        return {cam: self._cutting.submit(cut, cam, v) for cam, v in ep.videos.items()}

    def _clip_kind(self, cam: str) -> tuple[tuple[int, int] | None, DepthParams | None]:
        """A camera's declared size and depth quantizer, as its clips carry them."""
        return self.info.declared_sizes.get(cam), self.info.depth.get(cam)

    def read_episode(self, shard: int, episode_index: int) -> ResidentEpisode:
        """The episode's rows from its data file; clips point into the source mp4s (cached if possible).

        Its rows must fit its mp4s as the converter requires (``check_episode_videos``: the files'
        frame rate, the rows inside the video, no other episode's frames), else SourceError before any
        frame is decoded. A failed read names the file and episode, and lets go of the mp4s held for it.
        """
        ep = self.src.episode(episode_index)
        held = self._hold_videos(episode_index)
        files = list(held)
        where = f"{self.src.data_url}/{ep.data_path}: episode {episode_index}"
        cutting: dict[str, Future[tuple[bytes, int, str] | None]] = {}
        try:
            local = self._local_videos(held, episode_index)
            self.src.read_video_headers([v.path for v in ep.videos.values()], local)
            for cam, v in ep.videos.items():  # a transport failure names the mp4; the file's own faults,
                # named with the episode, come from the checks below (the headers are then read)
                with reading(f"{self.src.data_url}/{v.path}: episode {episode_index} camera {cam}"):
                    with contextlib.suppress(SourceError, FileNotFoundError):
                        self.src.video_header(v.path, local.get(v.path))
            self.src.check_episode_videos(ep, local)
            cutting = self._start_cuts(ep, where)  # fetched while the table is read
            with reading(where):
                table = self.src.read_episode_table(ep)
            columns = checked_columns(table, self.info, episode_index, ep.length, where, SourceError)
            cuts = {cam: fetching.result() for cam, fetching in cutting.items()}
        except BaseException:
            for fetching in cutting.values():  # a running one finishes unread
                fetching.cancel()
            self._release(files)
            raise
        clips = {}
        nbytes = int(table.nbytes)
        for cam, v in ep.videos.items():
            url = self.src.local_path(v.path) or posixpath.join(self.src.data_url, v.path)
            at = f"{where} camera {cam} ({v.path})"
            first = v.first_frame(self.src.fps)
            cut = cuts.get(cam)
            if cut is not None:  # its decoder is dropped with the episode: one key per episode's cut
                data, at_frame, mappings = cut
                nbytes += len(data)
                key = f"{url}#{first}+{ep.length}"
                clips[cam] = ClipRef(key, data, None, at_frame, mappings, at, *self._clip_kind(cam))
            else:
                clips[cam] = ClipRef(url, None, local.get(v.path, url), first, None, at, *self._clip_kind(cam))
        release = (lambda: self._release(files)) if files else None
        return ResidentEpisode(episode_index, ep.length, columns, clips, nbytes, release)
