"""Building one shard: a byte-deterministic tar of whole episodes, and its sidecar.

Same source + same options = same bytes, whichever process, task or run builds the shard:
tar headers carry no time, owner or permissions of the machine, members come in plan order
(``key.json``, ``key.parquet``, then cameras sorted), parquet and JSON are written with fixed
options. Each episode's members are prepared before any is written, so a bad episode can be
skipped whole. A stream-copied clip of a local source is prepared as a layout (its new mp4
header plus byte ranges of the source file, ``FileRanges``) that the tar sink (``tar_sink``)
copies file to file; other members (rows, header, re-encoded, PyAV-cut or remote clips) are
held in memory, so the memory high-water mark is at most one episode's in-memory members.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, TypeVar

import av
import pyarrow as pa
import pyarrow.parquet as pq

from ..depth import is_depth
from ..episode_table import check_timestamps
from ..exceptions import ConvertError
from ..format import (
    ClipInfo,
    EpisodeEntry,
    EpisodeHeader,
    Sidecar,
    clip_member,
    episode_key,
    header_member,
    shard_name,
    table_member,
)
from ..language import language_column, language_keys
from ..lerobot_v3 import EpisodeMeta, LeRobotV3Source, SourceError
from ..mp4cut import Mp4CutUnsupported
from ..shard_plan import PlannedShard
from ..video import ClipError, check_decodes, cut_clip, cut_clip_layout, reencode_clip
from .plan import DEFAULT_RUN, ConvertOptions, RunOptions
from .tar_sink import FileRanges, Payload, TarSink, file_stat, payload_size

log = logging.getLogger(__name__)

# Fixed parquet writer options: one row group per episode, zstd, statistics for readers.
PARQUET_OPTIONS: dict[str, Any] = dict(
    compression="zstd",
    compression_level=3,
    use_dictionary=True,
    write_statistics=True,
    store_schema=True,
    version="2.6",
    data_page_version="1.0",
)

# One encoder thread: x264 with automatic threads gives different bytes on another machine
# (and under load), which would break byte-identical shards across tasks. --workers parallelises.
REENCODE_THREADS = 1

T = TypeVar("T")
EpisodeCallback = Callable[[int, int], None]  # (frames, bytes) after each episode


@dataclass(frozen=True)
class EpisodeMembers:
    """One episode ready to go into a tar: member payloads in tar order, plus clip facts."""

    key: str
    episode_index: int
    length: int
    payloads: tuple[tuple[str, Payload], ...]
    clips: dict[str, ClipInfo]


def header_bytes(header: EpisodeHeader) -> bytes:
    """The episode's ``.json`` member: sorted keys, no spaces, so the bytes are reproducible."""
    return json.dumps(header.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def parquet_bytes(table: pa.Table) -> bytes:
    """The episode's rows as parquet; chunks combined so page boundaries never depend on reads."""
    buf = pa.BufferOutputStream()
    pq.write_table(table.combine_chunks(), buf, row_group_size=max(table.num_rows, 1), **PARQUET_OPTIONS)
    return buf.getvalue().to_pybytes()


def _where(source: LeRobotV3Source, rel_path: str) -> str:
    return posixpath.join(source.data_url, rel_path)


def _with_video(source: LeRobotV3Source, rel_path: str, fn: Callable[[Any], T]) -> T:
    """Run ``fn`` on a local path when there is one (PyAV reads it natively), else on an open file."""
    local = source.local_path(rel_path)
    if local is not None:
        return fn(local)
    with source.open(rel_path) as f:
        return fn(f)


def _cut_ranges(path: str, first_frame: int, num_frames: int) -> tuple[FileRanges, ClipInfo]:
    """``cut_clip``'s byte-level cut of a local file, as file ranges instead of bytes."""
    try:
        st = file_stat(os.stat(path))  # before the layout: a file changed later is caught at copy time
    except OSError as e:
        raise Mp4CutUnsupported(f"cannot open the source: {e}") from e
    layout, info = cut_clip_layout(path, first_frame, num_frames)
    return FileRanges(path, layout.prefix, layout.ranges, st), info


def _stream_copy(source: LeRobotV3Source, rel_path: str, first: int, n: int) -> tuple[Payload, ClipInfo]:
    """A local mp4 the byte cutter takes becomes file ranges; anything else goes through cut_clip."""
    local = source.local_path(rel_path)
    if local is not None:
        try:
            return _cut_ranges(local, first, n)
        except Mp4CutUnsupported as e:
            log.debug("%s: cutting through cut_clip (%s)", local, e)
    return _with_video(source, rel_path, lambda src: cut_clip(src, first, n))


def _clip(
    source: LeRobotV3Source, ep: EpisodeMeta, cam: str, options: ConvertOptions, *, check_decode: bool = False
) -> tuple[Payload, ClipInfo]:
    """Stream copy when asked and possible, else re-encode (always for a resized camera); errors name
    the episode and the file. A depth camera is stream-copied whatever ``reencode`` says, else (its
    source has B-frames, as LeRobot's own depth clips do) re-encoded losslessly in 12 bits, never resized.

    A stream-copied clip's packets are decoded with strict error detection: its boundary GOPs
    always (a few frames per clip), every packet with ``check_decode``. Re-encoding decodes
    every frame strictly anyway. A corrupt packet fails the episode naming its frame.
    """
    ref = ep.videos[cam]
    first, n = ref.first_frame(source.fps), ep.length
    where = f"{_where(source, ref.path)}: episode {ep.episode_index} camera {cam}"
    size = options.size_of(cam)
    try:
        depth = is_depth(source.features[cam])  # 12-bit codes: copied, or re-encoded losslessly; never resized
        if depth or (options.reencode is None and size is None):
            try:
                copied = _stream_copy(source, ref.path, first, n)
            except ClipError as e:
                if depth:
                    log.info(
                        "episode %d camera %s: re-encoding losslessly (12-bit hevc) (%s)", ep.episode_index, cam, e
                    )
                else:
                    log.warning("episode %d camera %s: re-encoding as %s (%s)", ep.episode_index, cam, options.codec, e)
            else:
                _with_video(source, ref.path, lambda src: check_decodes(src, first, n, every_frame=check_decode))
                return copied
        return _with_video(
            source,
            ref.path,
            lambda src: reencode_clip(
                src,
                first,
                n,
                codec=options.codec,
                gop=options.gop,
                crf=options.effective_crf,
                threads=REENCODE_THREADS,
                size=None if depth else size,
                resize_mode=options.resize_mode,
                depth=depth,
            ),
        )
    except (ClipError, av.FFmpegError) as e:
        raise ConvertError(f"{where}: {e}") from None


def episode_members(
    source: LeRobotV3Source, episode_index: int, options: ConvertOptions, *, check_decode: bool = False
) -> EpisodeMembers:
    """Read, cut and encode everything one episode contributes to a shard (``check_decode``: see ``_clip``)."""
    ep = source.episode(episode_index)
    key = episode_key(ep.episode_index)
    cameras = tuple(sorted(ep.videos))
    try:
        table = source.read_episode_table(ep)
        tasks = source.episode_tasks(ep, table)
        source.check_episode_videos(ep)  # first: an fps the files lack is named as such, not as every row's time
        where = f"{_where(source, ep.data_path)}: episode {episode_index}"
        check_timestamps(table, source.fps, where, SourceError)
        for name in language_keys(source.features):  # carried as stored, once they are LeRobot's rows within bounds
            language_column(table.column(name), name, where, SourceError)
    except SourceError as e:
        message = str(e) if f"episode {episode_index}" in str(e) else f"episode {episode_index}: {e}"
        raise ConvertError(message) from None
    header = EpisodeHeader(
        episode_index=ep.episode_index,
        length=ep.length,
        tasks=tasks,
        fps=source.fps,
        cameras=cameras,
        dataset_from_index=ep.dataset_from_index,
    )
    payloads: list[tuple[str, Payload]] = [
        (header_member(key), header_bytes(header)),
        (table_member(key), parquet_bytes(table)),
    ]
    clips: dict[str, ClipInfo] = {}
    for cam in cameras:
        data, info = _clip(source, ep, cam, options, check_decode=check_decode)
        if info.num_frames != ep.length:
            raise ConvertError(
                f"{_where(source, ep.videos[cam].path)}: episode {ep.episode_index} camera {cam}: clip has "
                f"{info.num_frames} frames, the episode has {ep.length} rows"
            )
        payloads.append((clip_member(key, cam), data))
        clips[cam] = info
    return EpisodeMembers(key, ep.episode_index, ep.length, tuple(payloads), clips)


def build_shard(
    source: LeRobotV3Source,
    shard: PlannedShard,
    options: ConvertOptions,
    out: BinaryIO,
    *,
    run: RunOptions = DEFAULT_RUN,
    on_episode: EpisodeCallback | None = None,
) -> Sidecar:
    """Write shard ``shard`` as a tar to ``out`` and return its sidecar.

    A bad episode raises ConvertError, or with ``run.skip_bad_episodes`` is left out and recorded
    in the sidecar's ``skipped`` with the reason.
    """
    sink = TarSink(out)
    entries: list[EpisodeEntry] = []
    skipped: dict[int, str] = {}
    try:
        for episode_index in shard.episodes:
            try:
                ep = episode_members(source, episode_index, options, check_decode=run.check_decode)
            except ConvertError as e:
                if not run.skip_bad_episodes:
                    raise
                log.warning("skipping episode %d: %s", episode_index, e)
                skipped[episode_index] = str(e)
                if on_episode is not None:
                    on_episode(0, 0)
                continue
            members = {name: sink.add(name, data) for name, data in ep.payloads}
            stats = source.nested_episode_stats(episode_index)  # the loader aggregates them over any subset
            entries.append(EpisodeEntry(ep.key, ep.episode_index, ep.length, members, ep.clips, stats))
            if on_episode is not None:
                on_episode(ep.length, sum(payload_size(d) for _, d in ep.payloads))
        sha256 = sink.finish()
        entries = [replace(e, members={n: sink.checksummed(m) for n, m in e.members.items()}) for e in entries]
    finally:
        sink.close()
    return Sidecar(
        shard=shard_name(shard.index),
        size=sink.offset,
        sha256=sha256,
        episodes=tuple(entries),
        skipped=skipped,
    )
