"""Reading a LeRobot v3.0 dataset (local path or any fsspec URL).

Metadata (info, stats, tasks, episodes) is read up front; data files are read one at a time
when an episode's rows are asked for, so the dataset never sits in RAM whole. Every error
names the file, episode and field at fault.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import posixpath
import re
import stat
import string
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .exceptions import LeRobotShardsError
from .filesystems import protocols, resolve_source, url_to_fs
from .format import feature_shape
from .language import is_language_feature
from .names import UnsafeNameError, check_name, check_relpath
from .redaction import redact, without_credentials
from .safe_io import read_small
from .shard_plan import EpisodeSize
from .storage import StorageLocation, as_location
from .timeouts import bounded, open_bounded, with_timeouts

log = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
TABULAR_DTYPES = frozenset(
    {
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "string",
    }
)
VIDEO_DTYPE = "video"
IMAGE_DTYPE = "image"
MAX_JSON_BYTES = 64 * 1024 * 1024  # info.json and stats.json: kilobytes in practice
MAX_EPISODE_FRAMES = 10_000_000  # as format.MAX_EPISODE_FRAMES: 93 hours at 30 fps
# from/to timestamps may exceed the mp4's duration by rounding; more than half a frame is an error.
DURATION_SLACK_FRAMES = 0.5
# info.json's data_path/video_path templates: LeRobot's are ~60 characters with widths of 3.
MAX_TEMPLATE_CHARS = 1024
MAX_TEMPLATE_WIDTH = 32


_EPISODES_FILE = re.compile(r"chunk-[^/]*/file-[^/]*\.parquet")  # meta/episodes/chunk-*/file-*.parquet


class SourceError(LeRobotShardsError, ValueError):
    """The source dataset is not a valid LeRobot v3.0 dataset; the message says where."""


@dataclass(frozen=True)
class VideoRef:
    """One episode's clip inside a (possibly multi-episode) camera mp4."""

    path: str  # relative to the dataset root
    from_timestamp: float
    to_timestamp: float

    def first_frame(self, fps: float) -> int:
        """Index of the episode's first frame in the mp4 (files drift from k/fps by < 1 ms)."""
        return int(round(self.from_timestamp * fps))


HEADER_BLOCK_BYTES = 1 << 20  # an mp4's header read: its moov (often at the end) without 8 MiB blocks of frames


@dataclass(frozen=True)
class VideoHeader:
    """What a camera mp4's header says, read without decoding."""

    duration: float  # seconds
    frames: int  # 0 when the header does not count them


@dataclass(frozen=True)
class EpisodeMeta:
    episode_index: int
    length: int
    tasks: tuple[str, ...]
    data_path: str  # relative to the dataset root
    dataset_from_index: int
    dataset_to_index: int  # exclusive
    videos: dict[str, VideoRef]  # by camera key


def _read_json(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any]:
    """A JSON object from a metadata file: a regular file of at most ``MAX_JSON_BYTES`` (``read_small``)."""
    try:
        d = json.loads(read_small(fs, path, MAX_JSON_BYTES))
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # [[[[...]]]] 100,000 deep: the parser's own limit, named with the file
        raise SourceError(f"{path}: nested too deeply to be a metadata file") from None
    except LeRobotShardsError as e:  # not a regular file, or too large
        raise SourceError(str(e)) from None
    if not isinstance(d, dict):
        raise SourceError(f"{path}: not a JSON object (a JSON {type(d).__name__})")
    return d


def _regular(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse a local path that is not a regular file (a FIFO would block the read forever)."""
    if "file" in protocols(fs):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise SourceError(f"{path}: file not found") from None
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{path}: not a regular file")


def _read_parquet(fs: fsspec.AbstractFileSystem, path: str) -> pa.Table:
    # Fetch, then parse: a timeout or a refused connection is the storage's fault, never a reason to
    # call the file bad (``--skip-bad-episodes`` would drop its episodes for a slow network).
    _regular(fs, path)
    try:
        data = bounded(fs, "cat_file", path)
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except OSError as e:  # its text may name the endpoint
        raise OSError(
            redact(
                f"{path}: cannot read it ({type(e).__name__}: {e}); check that the storage is reachable and run again"
            )
        ) from None
    try:
        return pq.ParquetFile(pa.BufferReader(data)).read()  # read_table would import pyarrow.dataset (and pandas)
    except (pa.ArrowInvalid, OSError) as e:
        raise SourceError(f"{path}: not a readable parquet file ({e})") from None


def numpy_of(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric or boolean Arrow column as numpy, straight from its buffers (a view when it can be).

    ``to_numpy`` imports pandas on first use: 0.25 s and about 40 MB in every process (each
    DataLoader worker, each converter worker), seconds when workers start together on few cores.
    Columns with nulls or of other types still go through ``to_numpy``.
    """
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if arr.null_count == 0:
        if pa.types.is_boolean(t):
            if not len(arr):
                return np.empty(0, dtype=bool)
            bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
            return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)].astype(bool)
        if pa.types.is_floating(t) or pa.types.is_integer(t):
            kind = "f" if pa.types.is_floating(t) else ("i" if pa.types.is_signed_integer(t) else "u")
            dtype = np.dtype(f"{kind}{t.bit_width // 8}")
            if not len(arr):
                return np.empty(0, dtype=dtype)
            return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)


def _int64s(col: pa.ChunkedArray, where: str) -> np.ndarray:
    """An integer column as int64 numpy (``numpy_of``: no pandas import)."""
    if col.null_count:
        raise SourceError(f"{where} has {col.null_count} null value(s)")
    return numpy_of(col.cast(pa.int64()))


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise SourceError(f"{where}: missing field {key!r}")
    return d[key]


def _template_path(info: dict[str, Any], key: str, where: str, **values: Any) -> str:
    """``info[key]`` filled in with ``values``: a relative path that stays inside the dataset, or SourceError."""
    template = info[key]
    if not isinstance(template, str):
        raise SourceError(f"{where}: field {key!r} is not a string ({template!r})")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise SourceError(f"{where}: field {key!r} is {len(template)} characters long, not a path template")
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as e:
        raise SourceError(f"{where}: field {key!r} = {template!r} is not a valid path template ({e})") from None
    for _, name, spec, _ in fields:  # a width is bounded before it is used: {chunk_index:0900000000d} is 900 MB
        if "{" in (spec or "") or any(int(w) > MAX_TEMPLATE_WIDTH for w in re.findall(r"\d+", spec or "")):
            raise SourceError(
                f"{where}: field {key!r} = {template[:80]!r}: {{{name}:{(spec or '')[:20]}}} is not a path template's "
                f"field (format widths up to {MAX_TEMPLATE_WIDTH})"
            )
    try:
        path = template.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise SourceError(f"{where}: field {key!r} = {template!r} is not a valid path template ({e})") from None
    try:
        return check_relpath(path, f"field {key!r} (template {template!r})")
    except UnsafeNameError as e:
        raise SourceError(f"{where}: {e}") from None


def _row_int(row: dict[str, Any], key: str, at: str, low: int = 0, high: int = MAX_EPISODE_FRAMES * 1024) -> int:
    """An integer field of an episodes row in [low, high]: 4.9, NaN or 10**12 frames name the field."""
    value = row[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a column stored as double: 8.0 is 8
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SourceError(f"{at}: field {key!r} = {value!r} is not an integer in [{low}, {high}]")
    return value


def _column(table: pa.Table, name: str, where: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise SourceError(f"{where}: missing column {name!r} (has {', '.join(table.column_names)})")
    return table.column(name)


def nested_stats(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A meta/episodes row's ``stats/<feature>/<stat>`` columns as {feature: {stat: value}} (null ones left out)."""
    out: dict[str, dict[str, Any]] = {}
    for column, value in row.items():
        if column.startswith("stats/") and value is not None:
            feature, _, name = column[len("stats/") :].rpartition("/")
            out.setdefault(feature, {})[name] = value
    return out


class LeRobotV3Source:
    """A LeRobot v3.0 dataset: metadata in memory, data files read on demand.

    Args:
        root: local directory or fsspec URL (``s3://bucket/dataset``).
        storage_options: passed to fsspec for remote roots.
        fs: the file system of ``root`` when the caller has one open (the loader's
            ``StorageLocation``, its timeouts applied); ``storage_options`` are then unused.
        allow_missing_files: open a dataset with missing data/video files anyway (logged); an
            episode that needs one raises SourceError when it is read (so converters can skip it).
        data_files: where the data files (``data/``, ``videos/``: parquet and mp4) are when not
            under ``root`` (a bucket mirror ``s3://...``, ``hf://buckets/...``, a local folder): a
            ``StorageLocation`` with its own storage options (the metadata's credentials never go
            to it), or a URL or path opened with none. The names the metadata gives them are
            checked as always (``_template_path``) before they are joined to it.
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: dict[str, Any] | None = None,
        allow_missing_files: bool = False,
        fs: Any = None,
        data_files: StorageLocation | str | os.PathLike[str] | None = None,
    ) -> None:
        without_credentials(str(root))  # registers a URL's password as a secret: never printed
        if fs is None:
            root = resolve_source(str(root), storage_options=storage_options)  # a Hub repo id: its hf:// URL
            storage_options = with_timeouts(str(root), storage_options)  # no read waits on a silent server for long
            fs, path = url_to_fs(str(root), **(storage_options or {}))
        else:
            path = fs._strip_protocol(str(root))
        self.fs, self.root = fs, path.rstrip("/")
        self.url = str(root)
        self.data_files = None if data_files is None else as_location(data_files)
        self.info = self._read_info()
        self.fps = float(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self._check_features()
        self.camera_keys = tuple(k for k, v in self.features.items() if v["dtype"] == VIDEO_DTYPE)
        self.image_keys = tuple(k for k, v in self.features.items() if v["dtype"] == IMAGE_DTYPE)
        stats_path = self._abs("meta/stats.json")
        self.stats: dict[str, Any] = _read_json(self.fs, stats_path) if bounded(self.fs, "exists", stats_path) else {}
        self.tasks = self._read_tasks()
        self.episodes, self.episode_stats = self._read_episodes()
        self._by_index = {e.episode_index: e for e in self.episodes}
        self._file_sizes, self.missing_files = self._check_files(allow_missing_files)
        self._data_cache: tuple[str, pa.Table] | None = None
        self._video_headers: dict[str, VideoHeader] = {}
        self._header_failures: dict[str, BaseException] = {}  # read_video_headers' failures, for the caller

    # -- metadata -------------------------------------------------------------------------------

    def _abs(self, rel: str) -> str:
        return posixpath.join(self.root, rel)

    @property
    def data_fs(self) -> Any:
        """The file system of the data files: the metadata's, or the data files root's (this process's)."""
        return self.fs if self.data_files is None else self.data_files.fs

    @property
    def data_root(self) -> str:
        return self.root if self.data_files is None else self.data_files.root

    @property
    def data_url(self) -> str:
        """The URL the data files' relative paths are joined to."""
        return self.url if self.data_files is None else self.data_files.url.rstrip("/")

    def data_path(self, rel: str) -> str:
        """A data or video file's path in ``data_fs``."""
        return posixpath.join(self.data_root, rel)

    def data_files_note(self) -> str:
        """For messages: where the metadata is, when the data files are elsewhere."""
        return "" if self.data_files is None else f" (the data files root of {without_credentials(self.url)})"

    def _read_info(self) -> dict[str, Any]:
        where = self._abs("meta/info.json")
        info = _read_json(self.fs, where)
        version = info.get("codebase_version")
        if version != CODEBASE_VERSION:
            hint = ""
            if isinstance(version, str) and version.startswith("v2"):
                hint = (
                    "; upgrade it with LeRobot's v2.1-to-v3.0 conversion tool (LeRobot 0.6: python -m "
                    "lerobot.scripts.convert_dataset_v21_to_v30 --repo-id=...; 0.4: "
                    "lerobot.datasets.v30.convert_dataset_v21_to_v30)"
                )
            raise SourceError(f"{where}: codebase_version is {version!r}, expected {CODEBASE_VERSION!r}{hint}")
        for key in ("fps", "features", "data_path", "total_episodes", "total_frames"):
            _require(info, key, where)
        fps = info["fps"]
        if (
            isinstance(fps, bool)
            or not isinstance(fps, (int, float))
            or not math.isfinite(fps)
            or not 0 < fps <= 10_000
        ):
            raise SourceError(f"{where}: fps = {fps!r} is not a frame rate (a finite number above 0)")
        if not isinstance(info["features"], dict) or not all(isinstance(v, dict) for v in info["features"].values()):
            raise SourceError(f"{where}: features is not an object of feature specs")
        for key in ("total_episodes", "total_frames"):
            if isinstance(info[key], bool) or not isinstance(info[key], int) or info[key] < 0:
                raise SourceError(f"{where}: {key} = {info[key]!r} is not a count")
        for key in ("data_path", "video_path"):  # a template that escapes the root fails here, before any episode
            if info.get(key) is not None:
                _template_path(info, key, where, chunk_index=0, file_index=0, video_key="camera")
        return info

    def _check_features(self) -> None:
        where = self._abs("meta/info.json")
        for name, spec in self.features.items():
            dtype = spec.get("dtype")
            if (
                dtype not in TABULAR_DTYPES
                and dtype not in (VIDEO_DTYPE, IMAGE_DTYPE)
                and not is_language_feature(name, spec)
            ):
                raise SourceError(f"{where}: feature {name!r} has unknown dtype {dtype!r}")
            feature_shape(spec, f"{where}: feature {name!r}", SourceError)
            if dtype == VIDEO_DTYPE and not self.info.get("video_path"):
                raise SourceError(f"{where}: feature {name!r} is a video but video_path is null")
            if dtype == VIDEO_DTYPE:  # camera keys become parts of file and member names
                try:
                    check_name(name, "camera feature name")
                except UnsafeNameError as e:
                    raise SourceError(f"{where}: {e}") from None

    def _read_tasks(self) -> tuple[str, ...]:
        where = self._abs("meta/tasks.parquet")
        table = _read_parquet(self.fs, where)
        name_col = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
        if name_col is None:
            raise SourceError(f"{where}: no task string column ('task' or '__index_level_0__')")
        names = table.column(name_col).to_pylist()
        idx = _column(table, "task_index", where).to_pylist()
        tasks: list[str | None] = [None] * len(names)
        seen: dict[str, int] = {}
        for name, i in zip(names, idx):
            if not isinstance(name, str):
                raise SourceError(f"{where}: task {i!r} is {name!r}, not a string")
            if type(i) is not int or not 0 <= i < len(names) or tasks[i] is not None:
                raise SourceError(f"{where}: task_index {i!r} of task {name!r} is out of range or repeated")
            if name in seen:  # LeRobot maps a task string to one task_index; the manifest lists each once
                raise SourceError(f"{where}: task {name!r} is listed twice (task_index {seen[name]} and {i})")
            seen[name] = i
            tasks[i] = name
        if not tasks:
            raise SourceError(f"{where}: no tasks (every frame has a task_index into this table)")
        return tuple(tasks)  # type: ignore[arg-type]

    def _read_episodes(self) -> tuple[tuple[EpisodeMeta, ...], pa.Table]:
        # Listed, not globbed: the dataset's own path may hold glob characters ("ds[x]" matched "dsx").
        folder = self._abs("meta/episodes")
        found = bounded(self.fs, "find", folder) if bounded(self.fs, "isdir", folder) else []
        files = sorted(f for f in found if _EPISODES_FILE.fullmatch(posixpath.relpath(f, folder)))
        if not files:
            raise SourceError(f"{self._abs('meta/episodes')}: no episodes parquet files")
        tables = [_read_parquet(self.fs, f) for f in files]
        meta_cols = [c for c in tables[0].column_names if not c.startswith("stats/")]
        stats_cols = ["episode_index"] + [c for c in tables[0].column_names if c.startswith("stats/")]
        episodes: list[EpisodeMeta] = []
        for path, table in zip(files, tables):
            for row in table.select([c for c in meta_cols if c in table.column_names]).to_pylist():
                episodes.append(self._episode_from_row(row, path))
        episodes.sort(key=lambda e: e.episode_index)
        seen: set[int] = set()
        for e in episodes:
            if e.episode_index in seen:
                raise SourceError(f"{self._abs('meta/episodes')}: episode {e.episode_index} is listed twice")
            seen.add(e.episode_index)
        total = self.info["total_episodes"]
        extra = sorted(e for e in seen if not 0 <= e < total)
        if extra or len(seen) != total:  # an episode dropped from the table would vanish silently
            # the first gaps, never range(total) whole: a total_episodes of 10**12 must fail, not fill memory
            gaps = [] if extra else list(itertools.islice((e for e in range(total) if e not in seen), 10))
            listed = f"lacks episodes {gaps[:10]}" if gaps else f"has episodes {extra[:10]}"
            raise SourceError(
                f"{self._abs('meta/episodes')}: {listed}, but meta/info.json has total_episodes = {total} "
                "(episodes 0..total_episodes-1, each listed once)"
            )
        stats = pa.concat_tables(
            [t.select([c for c in stats_cols if c in t.column_names]) for t in tables], promote_options="permissive"
        )
        return tuple(episodes), stats

    def _episode_from_row(self, row: dict[str, Any], where: str) -> EpisodeMeta:
        ep: Any = row.get("episode_index")  # checked below with the other required fields
        at = f"{where}: episode {ep}"
        for key in (
            "episode_index",
            "length",
            "data/chunk_index",
            "data/file_index",
            "dataset_from_index",
            "dataset_to_index",
        ):
            if row.get(key) is None:
                raise SourceError(f"{at}: missing field {key!r}")
        ep = _row_int(row, "episode_index", at)
        length = _row_int(row, "length", at, 1, MAX_EPISODE_FRAMES)
        first, end = (_row_int(row, k, at) for k in ("dataset_from_index", "dataset_to_index"))
        chunk, file = (_row_int(row, f"data/{k}", at) for k in ("chunk_index", "file_index"))
        if end - first != length:
            raise SourceError(
                f"{at}: length is {length} but dataset_from_index..dataset_to_index spans {end - first} rows"
            )
        info_where = self._abs("meta/info.json")
        data_path = _template_path(
            self.info,
            "data_path",
            f"{info_where} (for {at})",
            chunk_index=chunk,
            file_index=file,
        )
        videos: dict[str, VideoRef] = {}
        for cam in self.camera_keys:
            fields: dict[str, Any] = {
                k: row.get(f"videos/{cam}/{k}") for k in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
            }
            missing = [f"videos/{cam}/{k}" for k, v in fields.items() if v is None]
            if missing:
                raise SourceError(f"{at}: missing field(s) {', '.join(missing)}")
            path = _template_path(
                self.info,
                "video_path",
                f"{info_where} (for {at})",
                video_key=cam,
                chunk_index=_row_int(row, f"videos/{cam}/chunk_index", at),
                file_index=_row_int(row, f"videos/{cam}/file_index", at),
            )
            stamps = [row[f"videos/{cam}/{k}"] for k in ("from_timestamp", "to_timestamp")]
            for k, t in zip(("from_timestamp", "to_timestamp"), stamps):
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                    raise SourceError(f"{at}: field 'videos/{cam}/{k}' = {t!r} is not a finite number of seconds")
            videos[cam] = VideoRef(path, float(stamps[0]), float(stamps[1]))
        return EpisodeMeta(
            episode_index=ep,
            length=length,
            tasks=tuple(row.get("tasks") or ()),
            data_path=data_path,
            dataset_from_index=first,
            dataset_to_index=end,
            videos=videos,
        )

    def _check_files(self, allow_missing: bool) -> tuple[dict[str, int], dict[str, int]]:
        """List data and video files once; report every missing one together.

        Returns the sizes of present files and, for missing ones, the first episode needing each.
        """
        needed: dict[str, int] = {}
        for e in self.episodes:
            needed.setdefault(e.data_path, e.episode_index)
            for v in e.videos.values():
                needed.setdefault(v.path, e.episode_index)
        sizes: dict[str, int] = {}
        # The folders the paths name (data/ and videos/ by default; info.json's templates may name others).
        for sub in sorted({"data", "videos", *(p.split("/", 1)[0] for p in needed if "/" in p)}):
            top = self.data_path(sub)
            if bounded(self.data_fs, "isdir", top):
                for path, detail in bounded(self.data_fs, "find", top, detail=True).items():
                    sizes[posixpath.relpath(path, self.data_root)] = int(detail.get("size") or 0)
        missing = {p: ep for p, ep in needed.items() if p not in sizes}
        if missing:
            local = "file" in protocols(self.data_fs)

            def why(rel: str) -> str:  # a file found only through a symlinked folder is not read
                linked = local and os.path.exists(self.data_path(rel))
                return ", reached only through a symlink, which is not followed" if linked else ""

            listing = "; ".join(f"{p} (first needed by episode {ep}{why(p)})" for p, ep in sorted(missing.items()))
            message = f"{self.data_url}: {len(missing)} missing file(s){self.data_files_note()}: {listing}"
            if not allow_missing:
                raise SourceError(message)
            log.warning(message)
        return sizes, missing

    def content_digest(self) -> str:
        """A digest of what a conversion reads: the bytes of every file under meta/ (info, tasks,
        episodes, stats) and the name and size of every data and video file. Another digest is
        another source (rows or stats rewritten with the same lengths), whose episodes must not
        be mixed with shards written from this one."""
        h = hashlib.sha256()
        meta = self._abs("meta")
        for path in sorted(bounded(self.fs, "find", meta) if bounded(self.fs, "isdir", meta) else []):
            data = bounded(self.fs, "cat_file", path)
            h.update(f"{posixpath.relpath(path, self.root)}\0{len(data)}\n".encode())
            h.update(data)
        for rel, size in sorted(self._file_sizes.items()):
            h.update(f"{rel}\0{size}\n".encode())
        return h.hexdigest()

    def _require_file(self, rel_path: str, episode_index: int) -> None:
        if rel_path in self.missing_files:
            raise SourceError(f"{self.data_path(rel_path)}: file not found (needed by episode {episode_index})")

    # -- public accessors -----------------------------------------------------------------------

    @property
    def total_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    def episode(self, episode_index: int) -> EpisodeMeta:
        try:
            return self._by_index[episode_index]
        except KeyError:
            raise SourceError(f"{self.url}: no episode {episode_index}") from None

    def file_size(self, rel_path: str) -> int:
        return self._file_sizes[rel_path]

    def open(self, rel_path: str) -> Any:
        """Open a file of the dataset for reading; from object storage every fetch is bounded
        (``timeouts.open_bounded``)."""
        _regular(self.data_fs, self.data_path(rel_path))
        return open_bounded(self.data_fs, self.data_path(rel_path))

    def local_path(self, rel_path: str) -> str | None:
        """The file's local path when the root is on local disk, else None. A path that is not a
        regular file is refused here, before any reader opens it: a FIFO would block that forever."""
        if "file" not in protocols(self.data_fs):
            return None
        _regular(self.data_fs, self.data_path(rel_path))
        return self.data_path(rel_path)

    def episode_sizes(self) -> list[EpisodeSize]:
        """Estimated shard bytes per episode, from metadata and file sizes only (for planning)."""
        data_rows: dict[str, int] = {}
        video_frames: dict[str, int] = {}
        for e in self.episodes:
            data_rows[e.data_path] = data_rows.get(e.data_path, 0) + e.length
            for v in e.videos.values():
                video_frames[v.path] = video_frames.get(v.path, 0) + e.length
        out = []
        for e in self.episodes:
            est = self._file_sizes.get(e.data_path, 0) * e.length / data_rows[e.data_path]
            est += sum(self._file_sizes.get(v.path, 0) * e.length / video_frames[v.path] for v in e.videos.values())
            out.append(EpisodeSize(e.episode_index, e.length, int(est)))
        return out

    def episode_stats_row(self, episode_index: int) -> dict[str, Any]:
        """The ``stats/...`` columns of one episode (kept apart from the episode metadata)."""
        idx = numpy_of(self.episode_stats.column("episode_index"))
        rows = np.flatnonzero(idx == episode_index)
        if len(rows) == 0:
            raise SourceError(f"{self.url}: no stats row for episode {episode_index}")
        return self.episode_stats.slice(int(rows[0]), 1).to_pylist()[0]

    def nested_episode_stats(self, episode_index: int) -> dict[str, dict[str, Any]] | None:
        """One episode's stats as {feature: {stat: values}} (plain lists, as the converter stores them); None without."""
        return nested_stats(self.episode_stats_row(episode_index)) or None

    # -- rows -----------------------------------------------------------------------------------

    def _data_file(self, rel_path: str) -> pa.Table:
        if self._data_cache is not None and self._data_cache[0] == rel_path:
            return self._data_cache[1]
        where = self.data_path(rel_path)
        table = _read_parquet(self.data_fs, where)
        missing = [k for k, v in self.features.items() if v["dtype"] != VIDEO_DTYPE and k not in table.column_names]
        if missing:
            raise SourceError(
                f"{where}: feature(s) {', '.join(map(repr, missing))} declared in meta/info.json have no column "
                f"(the file has {', '.join(table.column_names)})"
            )
        index = _int64s(_column(table, "index", where), f"{where}: column 'index'")
        if len(index) and not np.array_equal(index, np.arange(index[0], index[0] + len(index))):
            bad = int(np.flatnonzero(np.diff(index) != 1)[0])
            raise SourceError(
                f"{where}: column 'index' is not contiguous (row {bad} has {index[bad]}, row {bad + 1} has "
                f"{index[bad + 1]})"
            )
        self._data_cache = (rel_path, table)
        return table

    def read_episode_table(self, episode: EpisodeMeta | int) -> pa.Table:
        """The episode's rows in ``index`` order, with the source schema."""
        ep = self.episode(episode) if isinstance(episode, int) else episode
        where = self.data_path(ep.data_path)
        self._require_file(ep.data_path, ep.episode_index)
        table = self._data_file(ep.data_path)
        first = table.column("index")[0].as_py() if table.num_rows else 0
        start = ep.dataset_from_index - first
        rows = table.slice(max(start, 0), ep.length) if start >= 0 else table.slice(0, 0)
        if rows.num_rows != ep.length:
            raise SourceError(
                f"{where}: episode {ep.episode_index} has length {ep.length} in meta/episodes but the file holds "
                f"{rows.num_rows} of its rows (index {ep.dataset_from_index}..{ep.dataset_to_index - 1})"
            )
        ep_col = _int64s(_column(rows, "episode_index", where), f"{where}: column 'episode_index'")
        if not np.all(ep_col == ep.episode_index):
            other = int(ep_col[np.flatnonzero(ep_col != ep.episode_index)[0]])
            raise SourceError(
                f"{where}: rows index {ep.dataset_from_index}..{ep.dataset_to_index - 1} should belong to episode "
                f"{ep.episode_index} but field 'episode_index' holds {other}"
            )
        for row in (start - 1, start + ep.length):  # the neighbours: a length set too low leaves rows behind
            if 0 <= row < table.num_rows and table.column("episode_index")[row].as_py() == ep.episode_index:
                raise SourceError(
                    f"{where}: row index {first + row} also belongs to episode {ep.episode_index}, outside its "
                    f"dataset_from_index..dataset_to_index ({ep.dataset_from_index}..{ep.dataset_to_index - 1}) "
                    f"in meta/episodes: its length {ep.length} is wrong"
                )
        return rows

    def episode_tasks(self, episode: EpisodeMeta | int, table: pa.Table) -> tuple[str, ...]:
        """The tasks an episode's frames carry, as LeRobot gives them: meta/tasks.parquet's strings at
        the rows' ``task_index`` (``table``: the episode's rows).

        meta/episodes' ``tasks`` column says the same in a dataset LeRobot wrote, and its order is
        kept then. LeRobot reads samples' tasks by ``task_index`` only, so a dataset whose column
        went stale (tasks.parquet edited alone) still trains there: the rows' tasks win
        (``stale_task_episodes`` lists such episodes from the metadata).
        """
        ep = self.episode(episode) if isinstance(episode, int) else episode
        if "task_index" not in table.column_names or not table.num_rows:
            return ep.tasks
        where = f"{self.data_path(ep.data_path)}: episode {ep.episode_index}"
        used = np.unique(_int64s(table.column("task_index"), f"{where}: column 'task_index'"))
        if used[0] < 0 or used[-1] >= len(self.tasks):
            bad = int(used[0] if used[0] < 0 else used[-1])
            raise SourceError(
                f"{where}: task_index {bad} is not a task (meta/tasks.parquet has {len(self.tasks)} tasks)"
            )
        named = tuple(self.tasks[int(i)] for i in used)
        return ep.tasks if set(ep.tasks) == set(named) and len(set(ep.tasks)) == len(ep.tasks) else named

    def stale_task_episodes(self) -> list[int]:
        """Episodes whose meta/episodes ``tasks`` name a task meta/tasks.parquet lacks (``episode_tasks``)."""
        known = set(self.tasks)
        return [e.episode_index for e in self.episodes if not set(e.tasks) <= known]

    def iter_episode_tables(self, episodes: Iterable[EpisodeMeta | int]) -> Iterator[tuple[EpisodeMeta, pa.Table]]:
        """Rows of many episodes; consecutive episodes of one data file read that file once."""
        for e in episodes:
            ep = self.episode(e) if isinstance(e, int) else e
            yield ep, self.read_episode_table(ep)

    # -- video ----------------------------------------------------------------------------------

    def video_header(self, rel_path: str, local_path: str | None = None) -> VideoHeader:
        """Duration and frame count of a camera mp4, from its header (no decode); once per file.

        ``local_path``: a copy of the file on local disk (a raw loader's cache) read instead of storage.
        """
        failed = self._header_failures.pop(rel_path, None)
        if failed is not None:  # read at once by read_video_headers: a paused server is not waited out twice
            raise failed
        if rel_path not in self._video_headers:
            import av

            where = self.data_path(rel_path)
            if local_path is None:
                _regular(self.data_fs, where)
            try:
                with contextlib.ExitStack() as stack:
                    f = (
                        local_path
                        if local_path is not None
                        else stack.enter_context(
                            open_bounded(self.data_fs, self.data_path(rel_path), block_size=HEADER_BLOCK_BYTES)
                        )
                    )
                    container = stack.enter_context(av.open(f))
                    stream = container.streams.video[0]
                    if stream.duration is not None:
                        duration = float(stream.duration * stream.time_base)
                    else:
                        duration = float(container.duration or 0) / av.time_base
                    frames = int(stream.frames or 0)
            except (av.FFmpegError, IndexError) as e:
                raise SourceError(f"{where}: not a readable mp4 with a video stream ({e})") from None
            self._video_headers[rel_path] = VideoHeader(duration, frames)
        return self._video_headers[rel_path]

    def check_episode_videos(self, episode: EpisodeMeta | int, local_paths: Mapping[str, str] | None = None) -> None:
        """Raise unless the episode's rows fit its mp4s: the converter's check, and the raw loader's
        when it admits an episode (``local_paths``: mp4s it already holds on local disk).

        The rows decide which frames an episode has: frames [first, first + length) of each camera
        mp4, first = ``from_timestamp`` * fps rounded (real files drift from k/fps by fractions of a
        frame), must lie inside the video and belong to no other episode of that file, and the mp4
        must play at meta/info.json's fps (else every frame found by position is another one).
        ``to_timestamp`` is not trusted (real recordings have it a frame short of the rows while the
        mp4 holds every frame, and LeRobot reads by the rows' timestamps); ``span_mismatches`` lists
        such episodes.
        """
        ep = self.episode(episode) if isinstance(episode, int) else episode
        slack = DURATION_SLACK_FRAMES / self.fps
        self.read_video_headers([v.path for v in ep.videos.values()], local_paths or {})
        for cam, v in ep.videos.items():
            self._require_file(v.path, ep.episode_index)
            try:
                header = self.video_header(v.path, (local_paths or {}).get(v.path))
            except SourceError as e:  # the path names the camera
                raise SourceError(f"episode {ep.episode_index}: {e}") from None
            self._check_frame_rate(v.path, header, f"episode {ep.episode_index} camera {cam}")
            end = v.from_timestamp + ep.length / self.fps
            if v.from_timestamp < -slack or end > header.duration + slack:
                raise SourceError(
                    f"{self.data_path(v.path)}: episode {ep.episode_index} field videos/{cam}/from_timestamp = "
                    f"{v.from_timestamp:.4f} s plus its {ep.length} rows ends at {end:.4f} s, outside the video "
                    f"(duration {header.duration:.4f} s): the mp4 lacks frames of this episode"
                )
        self.check_episode_frames(ep)

    def read_video_headers(self, paths: Iterable[str], local_paths: Mapping[str, str]) -> None:
        """Read the headers of several mp4s not read yet at once: from object storage each takes a few
        round trips, which the cameras of an episode would otherwise wait out one after another. A
        failure is kept for the caller's own ``video_header`` call, which raises it (naming the episode
        and camera) instead of reading again: against a paused server each read waits out a deadline."""
        todo = [p for p in dict.fromkeys(paths) if p not in self._video_headers and p not in self.missing_files]
        if len(todo) < 2 or all(p in local_paths or self.local_path(p) for p in todo):
            return

        def read(path: str) -> None:
            try:
                self.video_header(path, local_paths.get(path))
            except Exception as e:  # raised by the caller's read, with its context
                self._header_failures[path] = e

        with ThreadPoolExecutor(len(todo), thread_name_prefix="mp4-headers") as pool:
            list(pool.map(read, todo))

    def _check_frame_rate(self, rel_path: str, header: VideoHeader, at: str) -> None:
        """Raise unless the mp4's frames fill its duration at meta/info.json's fps (within half a frame
        over the whole file, so that rounding ``from_timestamp`` * fps finds every episode's first frame)."""
        if (
            header.frames
            and header.duration > 0
            and abs(header.frames - header.duration * self.fps) > DURATION_SLACK_FRAMES
        ):
            raise SourceError(
                f"{self.data_path(rel_path)}: {at}: the mp4 holds {header.frames} frames over {header.duration:.4f} s "
                f"({header.frames / header.duration:.4g} fps), but meta/info.json has fps = {self.info['fps']!r}: "
                "frames found at that rate would be other frames"
            )

    def check_episode_frames(self, episode: EpisodeMeta | int) -> None:
        """Raise unless, by its rows, the episode's frames in each camera mp4 overlap no other episode's.

        Metadata only (no file is read): the raw loader checks its episodes when it opens the dataset.
        A ``from_timestamp`` more than half a frame off the frame grid, or an fps that is not the
        files', shows here as rows reaching into a neighbour's frames.
        """
        ep = self.episode(episode) if isinstance(episode, int) else episode
        for cam, v in ep.videos.items():
            other = self._overlapping_episode(ep, cam)
            if other is not None:
                first = v.first_frame(self.fps)
                raise SourceError(
                    f"{self.data_path(v.path)}: episode {ep.episode_index} field videos/{cam}/from_timestamp = "
                    f"{v.from_timestamp:.4f} s: its {ep.length} rows (field 'length') would take frames "
                    f"{first}..{first + ep.length - 1} at meta/info.json's fps {self.fps:g}, which overlap episode "
                    f"{other}'s frames in that file"
                )

    @functools.cached_property
    def _clip_ranges(self) -> dict[str, list[tuple[int, int, int]]]:
        """Per camera mp4: (first frame, end frame, episode) of every episode in it, by the rows, sorted."""
        ranges: dict[str, list[tuple[int, int, int]]] = {}
        for e in self.episodes:
            for v in e.videos.values():
                first = v.first_frame(self.fps)
                ranges.setdefault(v.path, []).append((first, first + e.length, e.episode_index))
        for r in ranges.values():
            r.sort()
        return ranges

    def _overlapping_episode(self, ep: EpisodeMeta, cam: str) -> int | None:
        """Another episode whose frames (by its rows) overlap ``ep``'s in the camera's mp4, if any."""
        v = ep.videos[cam]
        first = v.first_frame(self.fps)
        end = first + ep.length
        ranges = self._clip_ranges[v.path]
        i = bisect.bisect_left(ranges, (first, end, ep.episode_index))
        for j in (i - 1, i + 1):  # neighbours in start order
            if 0 <= j < len(ranges):
                other_first, other_end, other = ranges[j]
                if other != ep.episode_index and other_first < end and first < other_end:
                    return other
        return None

    def span_mismatches(self) -> list[int]:
        """Episodes whose ``videos/*/to_timestamp`` disagrees with their number of rows (read by the rows)."""
        out = []
        for e in self.episodes:
            spans = (int(round(v.to_timestamp * self.fps)) - v.first_frame(self.fps) for v in e.videos.values())
            if any(n != e.length for n in spans):
                out.append(e.episode_index)
        return out

    def missing_files_for(self, episodes: Iterable[int]) -> dict[str, int]:
        """The missing data/video files these episodes need, each with the first episode needing it."""
        out: dict[str, int] = {}
        for index in episodes:
            e = self.episode(index)
            for path in (e.data_path, *(v.path for v in e.videos.values())):
                if path in self.missing_files:
                    out.setdefault(path, e.episode_index)
        return out

    def validate(self, *, videos: bool = True) -> None:
        """Check every episode's rows (and clip ranges); raises SourceError at the first fault."""
        for ep, _ in self.iter_episode_tables(self.episodes):
            if videos:
                self.check_episode_videos(ep)
