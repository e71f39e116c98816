"""Where resident episodes come from: converted shards, or a raw LeRobot v3.0 dataset.

Both sources implement ``EpisodeSource``: they expose the same shard plan (the raw one applies
the converter's plan as virtual shards) and read one episode into a ``ResidentEpisode``: tables
as numpy arrays, video still encoded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import format as fmt
from ..lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE, LeRobotV3Source, SourceError, protocols
from ..names import check_name, confined_join
from ..shard_plan import plan_shards
from .integrity import IntegrityError, check_episode_bytes, download_verified, sha256_file
from .partition import ShardSpec
from .remote import reading

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClipRef:
    """An encoded clip a decoder can open: bytes of a cut clip, or a path/URL of a source mp4."""

    cache_key: str  # decoders are cached by this key
    data: bytes | None  # the clip itself (converted shards)
    url: str | None  # or a source mp4 (raw datasets), shared by the episodes it holds
    first_frame: int  # index of episode frame 0 inside the clip or mp4
    frame_mappings: str | None  # torchcodec custom_frame_mappings for exact seeks without a scan
    where: str = "clip"  # dataset, shard or file, episode and camera: decode errors name them


@dataclass
class ResidentEpisode:
    """One episode in the pool: tables decoded into numpy, video still encoded."""

    episode_index: int
    length: int
    columns: dict[str, np.ndarray]  # per tabular/image feature, first axis = frame
    clips: dict[str, ClipRef]  # per camera
    nbytes: int  # bytes read to load it


@dataclass
class SourceInfo:
    """What a source knows at open, before reading any episode: enough to plan every consumer."""

    fps: float
    features: dict[str, dict[str, Any]]
    cameras: tuple[str, ...]
    tasks: tuple[str, ...]
    shards: list[ShardSpec]
    stats: dict[str, Any]  # the source's meta/stats.json ({} when absent)


def table_to_columns(table: pa.Table, features: dict[str, dict[str, Any]], where: str) -> dict[str, np.ndarray]:
    """Parquet rows into per-feature numpy arrays; vectors become (N, D)."""
    out: dict[str, np.ndarray] = {}
    for name, spec in features.items():
        if spec["dtype"] == VIDEO_DTYPE:
            continue
        if name not in table.column_names:
            raise ValueError(f"{where}: feature {name!r} has no column (has {', '.join(table.column_names)})")
        col = table.column(name).combine_chunks()
        if spec["dtype"] == IMAGE_DTYPE:
            out[name] = np.array([v["bytes"] if isinstance(v, dict) else v for v in col.to_pylist()], dtype=object)
        elif pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            flat = col.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out[name] = np.array(col.to_pylist(), dtype=object)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


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

    def read_episode(self, shard: int, episode_index: int) -> ResidentEpisode:
        """One episode of ``shard``: its tables decoded, its clips still encoded.

        Raises ``IntegrityError`` when its bytes do not match their checksum (after one re-fetch),
        and any other read failure as an error naming the shard or file and the episode.
        """
        ...

    def prefetch(self, shard: int) -> None:
        """Hint that ``shard`` is read next: start fetching it in the background (may do nothing)."""
        ...

    def close(self) -> None:
        """Release files and background work; the source is not used afterwards."""
        ...


def open_source(
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    shard_bytes: int | None = None,
    episodes_per_shard: int | None = None,
    episodes: Sequence[int] | None = None,
) -> EpisodeSource:
    """A converted dataset (has manifest.json) or a raw LeRobot v3.0 dataset (has meta/info.json).

    ``episodes``: the subset that will be read; a raw dataset then needs only their files.
    """
    with reading(str(url)):
        return _open_source(str(url), storage_options, cache_dir, shard_bytes, episodes_per_shard, episodes)


def _open_source(
    url: str,
    storage_options: dict[str, Any] | None,
    cache_dir: str | None,
    shard_bytes: int | None,
    episodes_per_shard: int | None,
    episodes: Sequence[int] | None,
) -> EpisodeSource:
    fs, path = fsspec.core.url_to_fs(str(url), **(storage_options or {}))
    path = path.rstrip("/")
    if path.endswith(fmt.MANIFEST_NAME):
        path = posixpath.dirname(path)
        url = str(url).rstrip("/")[: -len(fmt.MANIFEST_NAME)].rstrip("/")
    if fs.exists(posixpath.join(path, fmt.MANIFEST_NAME)):
        return ShardSource(str(url), storage_options=storage_options, cache_dir=cache_dir)
    if fs.exists(posixpath.join(path, "meta/info.json")):
        return RawSource(
            str(url),
            storage_options=storage_options,
            shard_bytes=shard_bytes,
            episodes_per_shard=episodes_per_shard,
            episodes=episodes,
        )
    raise FileNotFoundError(
        f"{url}: neither a converted dataset ({fmt.MANIFEST_NAME}) nor a LeRobot v3.0 dataset (meta/info.json)"
    )


class ShardSource:
    """A converted dataset: manifest, per-shard sidecars, episodes read by byte range."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None):
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        self.root = self.root.rstrip("/")
        self.cache_dir = cache_dir
        where = posixpath.join(self.url, fmt.MANIFEST_NAME)
        with self.fs.open(posixpath.join(self.root, fmt.MANIFEST_NAME), "rb") as f:
            self.manifest = fmt.Manifest.from_json(f.read(), where=where)
        m = self.manifest
        self._records = {s.index: s for s in m.shards}
        self._by_name = {s.name: s for s in m.shards}
        self._sidecars: dict[int, fmt.Sidecar] = {}
        self._entries: dict[int, tuple[int, fmt.EpisodeEntry]] = {}  # episode -> (shard, entry)
        self._open: tuple[int, Any] | None = None  # (shard index, file object)
        self._downloads: dict[str, Future[str]] = {}
        self._downloader: ThreadPoolExecutor | None = None  # started by the first download
        self.info = SourceInfo(
            fps=m.fps,
            features=m.features,
            cameras=m.cameras,
            tasks=m.tasks,
            shards=[ShardSpec(s.index, s.episodes, self._episode_lengths(s)) for s in m.shards],
            stats=m.source_stats,
        )

    def _shard_path(self, name: str) -> str:
        return posixpath.join(self.root, fmt.SHARDS_DIR, check_name(name, f"{self.url}: shard name"))

    def sidecar(self, shard: int) -> fmt.Sidecar:
        """The shard's index (member offsets, clip frame tables), read once and kept."""
        if shard not in self._sidecars:
            rec = self._records[shard]
            path = self._shard_path(rec.sidecar)
            with self.fs.open(path, "rb") as f:
                sc = fmt.Sidecar.from_json(f.read(), where=path)
            if sc.format_version != self.manifest.format_version:  # a sidecar cannot opt out of checksums
                raise fmt.FormatError(
                    f"{path}: format_version {sc.format_version}, but the manifest's is {self.manifest.format_version}"
                )
            self._sidecars[shard] = sc
            for e in sc.episodes:
                self._entries[e.episode_index] = (shard, e)
        return self._sidecars[shard]

    def _episode_lengths(self, rec: fmt.ShardRecord) -> tuple[int, ...]:
        if len(rec.episode_lengths) == len(rec.episodes):  # in the manifest: no sidecar read to plan
            return rec.episode_lengths
        lengths = {e.episode_index: e.length for e in self.sidecar(rec.index).episodes}  # an older manifest
        return tuple(lengths[e] for e in rec.episodes)

    def _local_copy(self, name: str) -> str | None:
        """Path of a shard in the cache dir (downloaded whole, atomically), or None without one."""
        if self.cache_dir is None or "file" in protocols(self.fs):
            return None
        self._start_download(name)
        return self._downloads[name].result()

    def _start_download(self, name: str) -> None:
        if name not in self._downloads:
            if self._downloader is None:
                self._downloader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
            self._downloads[name] = self._downloader.submit(self._download, name)

    def _cache_path(self, name: str) -> str:
        if self.cache_dir is None:
            raise RuntimeError(f"{self.url}: shard download without a cache_dir")
        sub = hashlib.sha1(self.url.encode()).hexdigest()[:16]
        return confined_join(os.path.join(self.cache_dir, sub), name, f"{self.url}: shard name")

    def _download(self, name: str) -> str:
        """The verified local copy of shard ``name``: downloaded (and checked against the manifest's
        size and sha256, twice at most) unless a copy of the right size is there. Format 1 shards,
        whose episodes cannot be checked one by one, are re-hashed when a source first uses them."""
        dst = self._cache_path(name)
        rec = self._by_name[name]
        where = f"{self.url}/{fmt.SHARDS_DIR}/{name}"
        if os.path.exists(dst):
            if os.path.getsize(dst) == rec.bytes and (
                self.manifest.format_version >= 2 or sha256_file(dst) == rec.sha256
            ):
                return dst
            log.warning("%s: cached copy %s is damaged; downloading it again", where, dst)
            os.remove(dst)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            download_verified(self.fs, self._shard_path(name), dst, size=rec.bytes, sha256=rec.sha256, where=where)
        except IntegrityError as e:
            log.warning("%s; downloading it again", e)
            download_verified(self.fs, self._shard_path(name), dst, size=rec.bytes, sha256=rec.sha256, where=where)
        return dst

    def prefetch(self, shard: int) -> None:
        """Start downloading a shard into the cache dir in the background (no-op without one)."""
        if self.cache_dir is not None and "file" not in protocols(self.fs):
            self._start_download(self._records[shard].name)

    def _file(self, shard: int) -> Any:
        if self._open is None or self._open[0] != shard:
            self._close_file()
            name = self._records[shard].name
            local = self._local_copy(name)
            f = open(local, "rb") if local else self.fs.open(self._shard_path(name), "rb", block_size=8 << 20)
            self._open = (shard, f)
        return self._open[1]

    def _close_file(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def close(self) -> None:
        """Close the open shard and stop the downloader: queued downloads are cancelled, one in
        flight finishes in the background (it lands atomically in the cache dir)."""
        self._close_file()
        if self._downloader is not None:
            self._downloader.shutdown(wait=False, cancel_futures=True)
            self._downloader = None

    def _drop(self, shard: int) -> None:
        """Forget what was read of ``shard``: the open file and, when cached, the local copy."""
        self._close_file()
        name = self._records[shard].name
        if self._downloads.pop(name, None) is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._cache_path(name))

    def _read_span(self, shard: int, entry: fmt.EpisodeEntry, where: str) -> bytes:
        """The episode's bytes, checked against the sidecar's member checksums."""
        start, end = entry.span()
        f = self._file(shard)
        f.seek(start)
        blob = f.read(end - start)
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

        try:
            table = pq.ParquetFile(io.BytesIO(member(fmt.table_member(entry.key)))).read()
        except (pa.ArrowException, OSError) as e:  # format 1 shards: bytes unchecked until here
            raise IntegrityError(
                f"{where}: member {fmt.table_member(entry.key)} is not readable parquet ({e})"
            ) from None
        columns = table_to_columns(table, self.info.features, where)
        clips = {
            cam: ClipRef(
                cache_key=f"{self.url}#{entry.key}.{cam}",
                data=member(fmt.clip_member(entry.key, cam)),
                url=None,
                first_frame=0,
                frame_mappings=clip.frame_mappings_json(),
                where=f"{where} camera {cam}",
            )
            for cam, clip in entry.clips.items()
        }
        return ResidentEpisode(episode_index, entry.length, columns, clips, len(blob))


class RawSource:
    """A raw LeRobot v3.0 dataset read in place, split into the converter's plan as virtual shards."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        shard_bytes: int | None = None,
        episodes_per_shard: int | None = None,
        episodes: Sequence[int] | None = None,
    ):
        self.url = url.rstrip("/")
        # With a subset, only its episodes' files must exist (as LeRobot downloads only those).
        self.src = LeRobotV3Source(self.url, storage_options=storage_options, allow_missing_files=episodes is not None)
        if episodes is not None:
            known = {e.episode_index for e in self.src.episodes}
            missing = self.src.missing_files_for(e for e in episodes if e in known)
            if missing:
                listing = "; ".join(f"{p} (needed by episode {ep})" for p, ep in sorted(missing.items()))
                raise SourceError(f"{self.url}: {len(missing)} missing file(s) for the chosen episodes: {listing}")
        plan = plan_shards(self.src.episode_sizes(), target_bytes=shard_bytes, episodes_per_shard=episodes_per_shard)
        self.info = SourceInfo(
            fps=self.src.fps,
            features=self.src.features,
            cameras=self.src.camera_keys,
            tasks=self.src.tasks,
            shards=[
                ShardSpec(p.index, p.episodes, tuple(self.src.episode(e).length for e in p.episodes)) for p in plan
            ],
            stats=self.src.stats,
        )

    def close(self) -> None:
        """Nothing to release: data files are opened per read, videos by the decoders."""

    def prefetch(self, shard: int) -> None:
        """No read-ahead: the source's files are read in place."""

    def read_episode(self, shard: int, episode_index: int) -> ResidentEpisode:
        """The episode's rows from its data file; clips point into the source mp4s."""
        ep = self.src.episode(episode_index)
        table = self.src.read_episode_table(ep)
        where = f"{self.url}/{ep.data_path}: episode {episode_index}"
        columns = table_to_columns(table, self.info.features, where)
        clips = {}
        for cam, v in ep.videos.items():
            url = self.src.local_path(v.path) or posixpath.join(self.url, v.path)
            clips[cam] = ClipRef(url, None, url, v.first_frame(self.src.fps), None, f"{where} camera {cam} ({v.path})")
        nbytes = int(table.nbytes)
        return ResidentEpisode(episode_index, ep.length, columns, clips, nbytes)
