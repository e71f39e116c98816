"""Checking a converted dataset against its manifest, sidecars and (optionally) its source.

Every shard is read once, as a stream: the bytes are hashed while tar headers are parsed, so
a flipped byte, a member at the wrong offset, a missing member or a clip with the wrong frame
count all show, and memory holds one episode at a time. The decode check decodes every frame
of every clip in order with strict error detection (a corrupt packet, even one copied from a
corrupt source, is a problem naming its frame) and, with a source, compares stream-copied
clips with the source's frames one by one; random frames also go through the loader's decoder
(torchcodec, random access) and are compared: identical for stream-copied clips, PSNR at or
above ``PSNR_THRESHOLD_DB`` for re-encoded ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ..episode_table import check_episode_table
from ..format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    EpisodeEntry,
    EpisodeHeader,
    FormatError,
    FrameTransform,
    Manifest,
    ShardRecord,
    Sidecar,
    check_episode_header,
    check_sidecar,
    clip_member,
    header_member,
    legacy_refusal,
    member_checksum,
    pack_offsets,
    sidecar_digest,
    table_member,
)
from ..lerobot_v3 import LeRobotV3Source, SourceError
from ..names import UnsafeNameError, check_name
from ..redaction import redact
from ..safe_io import check_local_file
from ..storage import StorageLocation
from ..tar_headers import TarHeaderError, member_header
from ..timeouts import bounded, is_checksum_error, open_bounded, read_failure
from ..video import ClipError, decode_frames, decoded_frames, probe_clip, transform_frame
from .destination import LEROBOT_INFO, RUN_RECORD, Destination
from .shard_status import shard_status

log = logging.getLogger(__name__)

# Re-encoded clips at the default CRFs score 40+ dB against the source decode; 30 dB is where
# artefacts become visible, so below it the re-encode (or the frame alignment) is wrong.
PSNR_THRESHOLD_DB = 30.0


@dataclass
class VerifyReport:
    """What ``verify_dataset`` checked and every problem it found; ``ok`` when there are none."""

    dest: str
    shards: int = 0
    episodes: int = 0
    frames: int = 0
    bytes: int = 0
    frames_compared: int = 0
    frames_decoded: int = 0  # every frame of every clip, in order, strict error detection
    frames_identical: int = 0
    min_psnr_db: float | None = None  # over re-encoded clips' compared frames
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems

    def problem(self, message: str) -> None:
        """Record one problem (logged at INFO as it is found: ``-v``); the message names the file and
        what is wrong. The report lists every problem, so an ERROR log would print each one twice."""
        log.info(message)
        self.problems.append(message)

    def __str__(self) -> str:
        lines = [
            f"verify {self.dest}: " + ("OK" if self.ok else f"FAILED ({_count(len(self.problems), 'problem')})"),
            f"  shards {self.shards}, episodes {self.episodes}, frames {self.frames}, {self.bytes / 1e6:.1f} MB "
            "checked (sha256, tar members against sidecar offsets, frame counts, episode stats, episode coverage)",
        ]
        if self.frames_decoded:
            lines.append(
                f"  decode check: {self.frames_decoded} frames decoded in order with strict error detection"
                + (", stream-copied ones compared with the source's one by one" if self.frames_compared else "")
            )
        if self.frames_compared:
            psnr = (
                ""
                if self.min_psnr_db is None
                else (f"; re-encoded frames: min PSNR {self.min_psnr_db:.1f} dB (threshold {PSNR_THRESHOLD_DB:.0f} dB)")
            )
            lines.append(
                f"  decode check: {self.frames_compared} frames compared with the source, "
                f"{self.frames_identical} bit-identical{psnr}"
            )
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


class _HashingReader:
    """Read-through wrapper: hashes every byte the tar parser reads, then the rest.

    It also keeps the raw bytes from ``keep_from`` on, so that each member's tar headers can be
    parsed again the way the loader parses them (``tar_headers.member_header``) without holding
    the members' data twice."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0
        self._kept = bytearray()  # raw bytes from max(_kept_from, ...) up to size
        self._kept_from = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        skip = max(0, self._kept_from - self.size)
        if skip < len(data):
            self._kept += data[skip:]
        self.size += len(data)
        return data

    def raw_bytes(self, start: int, end: int) -> bytes:
        """Bytes ``start..end`` of the tar as read (shorter when some were dropped or not yet read)."""
        if start < self._kept_from:
            return b""
        return bytes(self._kept[start - self._kept_from : end - self._kept_from])

    def keep_from(self, position: int) -> None:
        """Drop the kept bytes before ``position``, and keep none read before it from now on."""
        if position > self._kept_from:
            del self._kept[: position - self._kept_from]
            self._kept_from = position

    def finish(self) -> None:
        self.keep_from(1 << 62)  # nothing more is parsed
        while self.read(8 * 1024 * 1024):
            pass


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


class _SourceFrames:
    """Decodes source frames, keeping one decoder so consecutive episodes of a file scan it once."""

    def __init__(self, source: LeRobotV3Source) -> None:
        self.source = source
        self._current: tuple[str, Any] | None = None

    def _file(self, rel_path: str) -> tuple[Any, Any]:
        """(local path or the file's bytes, torchcodec decoder) of one source mp4."""
        from ..torch_pair import VideoDecoder

        if self._current is None or self._current[0] != rel_path:
            local = self.source.local_path(rel_path)
            if local is None:
                with self.source.open(rel_path) as f:
                    local_or_bytes: Any = f.read()
            else:
                local_or_bytes = local
            self._current = (rel_path, (local_or_bytes, VideoDecoder(local_or_bytes, seek_mode="exact")))
        return self._current[1]

    def get(self, rel_path: str, indices: list[int]) -> np.ndarray:
        return self._file(rel_path)[1].get_frames_at(indices).data.numpy()

    def sequential(self, rel_path: str, first_frame: int, num_frames: int) -> Iterator[tuple[int, Any]]:
        """The source's frames in order, strictly decoded (``video.decoded_frames``)."""
        return decoded_frames(self._file(rel_path)[0], first_frame, num_frames)


class _Verifier:
    def __init__(
        self,
        dest: Destination,
        manifest: Manifest,
        source: LeRobotV3Source | None,
        decode_check: int,
        seed: int,
        report: VerifyReport,
    ) -> None:
        self.dest, self.manifest, self.source, self.report = dest, manifest, source, report
        self.decode_check, self.seed = decode_check, seed
        self.source_frames = _SourceFrames(source) if source is not None else None

    def pack(self) -> None:
        """``sidecars.pack``: its size and sha256 as the manifest records them, and each sidecar's
        slice matching the sha256 the manifest records for that sidecar (the loader reads the slices
        instead of the files). Streamed slice by slice: a pack need not fit memory."""
        record = self.manifest.sidecar_pack
        assert record is not None
        where = self.dest.path(record.name)
        try:
            path = self.dest.confined(record.name)
            if self.dest.is_local:
                check_local_file(path, root=self.dest.root, where=where)
            offsets = pack_offsets(self.manifest)
            whole = hashlib.sha256()
            bad: list[str] = []
            with open_bounded(self.dest.fs, path) as f:
                for shard in self.manifest.shards:
                    start, end = offsets[shard.index]
                    data = f.read(end - start)
                    whole.update(data)
                    if sidecar_digest(data) != shard.sidecar_sha256:
                        bad.append(shard.sidecar)
                rest = len(f.read(1))
        except FileNotFoundError:
            self.report.problem(f"{where}: missing, though the manifest lists it")
            return
        except (OSError, FormatError) as e:
            self.report.problem(f"{where}: unreadable ({e})")
            return
        if bad:
            self.report.problem(
                f"{where}: the slices of {len(bad)} sidecars ({', '.join(bad[:3])}) differ from the sha256 the manifest "
                "records for them (edited or damaged after conversion)"
            )
        elif rest or whole.hexdigest() != record.sha256:
            self.report.problem(f"{where}: does not match the size and sha256 the manifest records for it")

    def shard(self, record: ShardRecord, bar: tqdm) -> list[int]:
        """Check one shard; returns the indices of the sidecar's episodes that the tar really holds."""
        rel = posixpath.join(SHARDS_DIR, record.name)
        where = self.dest.path(rel)
        # Size and sha256 are checked below against the manifest, while the tar streams by once.
        status = shard_status(self.dest, record.name, record.sidecar, version=self.manifest.format_version)
        sidecar = status.sidecar
        side_where = self.dest.path(posixpath.join(SHARDS_DIR, record.sidecar))
        if sidecar is None:
            self.report.problem(f"{where}: {status.problem}")
            return []
        if record.sidecar_sha256 is not None and (status.sidecar_sha256, status.sidecar_bytes) != (
            record.sidecar_sha256,
            record.sidecar_bytes,
        ):
            self.report.problem(
                f"{side_where}: does not match the sha256 and size the manifest records for it "
                "(edited or damaged after conversion)"
            )
        try:
            check_sidecar(sidecar, record, self.manifest)
        except FormatError as e:
            self.report.problem(f"{side_where}: {e}")
        self._against_source(side_where, sidecar)
        entries = {e.key: e for e in sidecar.episodes}
        seen: dict[str, dict[str, bytes]] = {}
        offsets: dict[str, tuple[int, int]] = {}
        try:
            path = self.dest.confined(rel)
            if self.dest.is_local:  # a FIFO would block the read forever, a directory fail in the tar parser
                check_local_file(path, root=self.dest.root, where=where)
            with open_bounded(self.dest.fs, path) as raw:
                reader = _HashingReader(raw)
                with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                    for info in tar:
                        headers = reader.raw_bytes(info.offset, info.offset_data)
                        reader.keep_from(info.offset_data + info.size)  # the data is read through tarfile
                        try:
                            check_name(info.name, f"{where}: tar member name")
                        except UnsafeNameError as e:
                            self.report.problem(str(e))
                            continue
                        self._loader_header(where, info, headers)
                        key = info.name.split(".", 1)[0]  # the WebDataset key
                        offsets[info.name] = (info.offset_data, info.size)
                        data = tar.extractfile(info).read() if info.isfile() else b""
                        if seen and key not in seen:
                            self._finish_episodes(where, entries, seen)
                        seen.setdefault(key, {})[info.name] = data
                        bar.update(info.size)
                    self._finish_episodes(where, entries, seen)
                reader.finish()
        except FileNotFoundError:
            self.report.problem(f"{where}: shard file missing")
            return []
        except tarfile.TarError as e:
            self.report.problem(f"{where}: not a readable tar ({e})")
            return []
        except FormatError as e:
            self.report.problem(str(e))
            return []
        except Exception as e:  # the storage's bytes failed its checksum: a problem of this shard, named
            if not is_checksum_error(e):
                raise  # the connection's: the command fails naming what it waited for (``explain``)
            self.report.problem(redact(f"{self.dest.url}/{rel}: {read_failure(e)}"))
            return []
        if reader.size != record.bytes:
            self.report.problem(f"{where}: {reader.size} bytes, the manifest says {record.bytes}")
        if reader.sha.hexdigest() != record.sha256:
            self.report.problem(
                f"{where}: sha256 {reader.sha.hexdigest()} does not match the manifest's {record.sha256}"
            )
        for entry in sidecar.episodes:
            for m in entry.members.values():
                got = offsets.get(m.name)
                if got is None:
                    self.report.problem(f"{where}: member {m.name} of episode {entry.episode_index} is missing")
                elif got != (m.offset, m.size):
                    self.report.problem(
                        f"{where}: member {m.name} lies at offset {got[0]} size {got[1]}, the sidecar "
                        f"says offset {m.offset} size {m.size}"
                    )
        known = {m for e in sidecar.episodes for m in e.members}
        for name in sorted(set(offsets) - known):
            self.report.problem(f"{where}: member {name} is not in the sidecar")
        self.report.shards += 1
        self.report.bytes += reader.size
        keys = {name.split(".", 1)[0] for name in offsets}
        return [e.episode_index for e in sidecar.episodes if e.key in keys]

    def _loader_header(self, where: str, info: tarfile.TarInfo, headers: bytes) -> None:
        """The member's tar headers read as the loader reads them (``tar_headers.member_header``)
        give the name and size ``tarfile`` read: a header the loader would refuse is a problem here."""
        try:
            got = member_header(headers)
        except TarHeaderError as e:
            self.report.problem(f"{where}: member {info.name} at byte {info.offset_data}: {e}")
            return
        if got != (info.name, info.size):
            self.report.problem(
                f"{where}: member {info.name} ({info.size} bytes) at byte {info.offset_data} reads as "
                f"{got[0]} ({got[1]} bytes) to the loader"
            )

    def _against_source(self, where: str, sidecar: Sidecar) -> None:
        """With a source: each episode's length and the clips' first frames are the source's."""
        if self.source is None:
            return
        for entry in sidecar.episodes:
            try:
                ep = self.source.episode(entry.episode_index)
            except (SourceError, KeyError):
                continue  # reported by the coverage check
            if ep.length != entry.length:
                self.report.problem(
                    f"{where}: episode {entry.episode_index} has {entry.length} frames, the source's {ep.length}"
                )
            if entry.stats is not None and entry.stats != self.source.nested_episode_stats(entry.episode_index):
                self.report.problem(f"{where}: episode {entry.episode_index}'s stats differ from the source's")

    def _finish_episodes(self, where: str, entries: dict[str, EpisodeEntry], seen: dict[str, dict[str, bytes]]) -> None:
        for key, payloads in seen.items():
            entry = entries.get(key)
            if entry is None:
                self.report.problem(f"{where}: tar holds key {key} that the sidecar does not list")
            else:
                self.episode(where, entry, payloads)
        seen.clear()

    def episode(self, where: str, entry: EpisodeEntry, payloads: dict[str, bytes]) -> None:
        at = f"{where}: episode {entry.episode_index}"
        for name, m in entry.members.items():
            data = payloads.get(name)
            if m.xxh3_128 is not None and data is not None and member_checksum(data) != m.xxh3_128:
                self.report.problem(f"{at}: member {name} does not match its checksum in the sidecar")
        try:
            header = EpisodeHeader.from_dict(json.loads(payloads[header_member(entry.key)]))
            try:
                check_episode_header(header, entry, self.manifest)
            except FormatError as e:
                self.report.problem(f"{at}: {e}")
            try:
                table = pq.read_table(pa.BufferReader(payloads[table_member(entry.key)]))
            except OSError as e:  # pyarrow's error for a damaged footer or page: a problem, not a crash
                self.report.problem(f"{at}: unreadable table {table_member(entry.key)} ({' '.join(str(e).split())})")
                return
            if self.source is not None:
                self._header_against_source(at, header, table)
            if table.num_rows != entry.length:
                self.report.problem(
                    f"{at}: {table_member(entry.key)} has {table.num_rows} rows, expected {entry.length}"
                )
            elif table.column("episode_index").to_pylist() != [entry.episode_index] * entry.length:
                self.report.problem(f"{at}: {table_member(entry.key)} holds rows of another episode")
            columns = set(table.column_names)
            for name, spec in self.manifest.features.items():
                if spec["dtype"] != "video" and name not in columns:
                    self.report.problem(f"{at}: {table_member(entry.key)} has no column for feature {name!r}")
            for problem in stats_against_table(entry, table):
                self.report.problem(f"{at}: {problem}")
            try:  # the loader's checks of the rows: widths, dtypes, frame_index, tasks by task_index
                check_episode_table(
                    table,
                    episode_index=entry.episode_index,
                    length=entry.length,
                    features=self.manifest.features,
                    tasks=self.manifest.tasks,
                    where=f"{at}: {table_member(entry.key)}",
                    error=FormatError,
                    episode_tasks=header.tasks,
                    fps=self.manifest.fps,
                )
            except FormatError as e:
                self.report.problem(str(e))
        except KeyError as e:
            self.report.problem(f"{at}: member or field {e} missing")
            return
        except (ValueError, pa.ArrowException) as e:
            self.report.problem(f"{at}: unreadable header or table ({e})")
            return
        if set(entry.clips) != set(self.manifest.cameras):
            self.report.problem(
                f"{at}: clips for {sorted(entry.clips)}, manifest cameras {list(self.manifest.cameras)}"
            )
        for cam, clip in sorted(entry.clips.items()):
            name = clip_member(entry.key, cam)
            data = payloads.get(name)
            if data is None:
                continue  # reported as a missing member
            try:
                probe = probe_clip(data)
            except (ClipError, ValueError) as e:
                self.report.problem(f"{at}: {name} does not demux ({e})")
                continue
            if not probe.num_frames == clip.num_frames == entry.length:
                self.report.problem(
                    f"{at}: {name} has {probe.num_frames} frames, sidecar says {clip.num_frames}, "
                    f"the episode has {entry.length}"
                )
            elif probe.frames != clip.frames:
                self.report.problem(f"{at}: {name} frame table differs from the sidecar's")
            elif self.decode_check:
                self._compare(at, entry, cam, data)
        self.report.episodes += 1
        self.report.frames += entry.length

    def _header_against_source(self, at: str, header: EpisodeHeader, table: pa.Table) -> None:
        """The header's tasks are those the source gives the episode's rows (``episode_tasks``, as the
        converter wrote them; the rows' ``task_index`` values are the converted table's)."""
        assert self.source is not None
        try:
            ep = self.source.episode(header.episode_index)
            want = self.source.episode_tasks(ep, table)
        except (SourceError, KeyError):
            return  # reported by the coverage check, or a task_index by the table's check
        if tuple(header.tasks) != tuple(want):
            self.report.problem(f"{at}: tasks {list(header.tasks)}, the source's {list(want)}")

    def _sequential(self, at: str, entry: EpisodeEntry, cam: str, data: bytes, source_path: str | None) -> None:
        """Decode every frame of the clip in order with strict error detection; a stream-copied clip's
        frames must equal the source's (``source_path``, decoded the same way) one by one."""
        clip = entry.clips[cam]
        name = clip_member(entry.key, cam)
        want = None
        if source_path is not None and clip.stream_copied and self.source_frames is not None:
            want = self.source_frames.sequential(source_path, clip.source_first_frame, entry.length)
        try:
            for i, frame in decoded_frames(data, 0, entry.length, label=name):
                self.report.frames_decoded += 1
                if want is None:
                    continue
                try:
                    _, ref = next(want)
                except ClipError as e:
                    self.report.problem(f"{at} camera {cam}: source {e}")
                    want = None
                    continue
                if not np.array_equal(frame.to_ndarray(), ref.to_ndarray()):
                    self.report.problem(
                        f"{at} camera {cam} frame {i}: {name} decodes differently from source frame "
                        f"{clip.source_first_frame + i} of {source_path}"
                    )
                    want = None
        except ClipError as e:
            self.report.problem(f"{at} camera {cam}: {e}")

    def _compare(self, at: str, entry: EpisodeEntry, cam: str, data: bytes) -> None:
        clip = entry.clips[cam]
        rng = np.random.default_rng([self.seed, entry.episode_index])
        indices = sorted(rng.choice(entry.length, size=min(self.decode_check, entry.length), replace=False).tolist())
        try:
            got = decode_frames(data, indices, frame_mappings=clip.frame_mappings_json()).numpy()
        except (RuntimeError, ValueError) as e:
            self.report.problem(f"{at}: {clip_member(entry.key, cam)} does not decode ({e})")
            return
        source = self.source
        if self.source_frames is None or source is None:
            self._sequential(at, entry, cam, data, None)
            return  # decodable is all that can be said without a source
        try:
            ref = source.episode(entry.episode_index).videos[cam]
        except (SourceError, KeyError):
            return  # reported by the coverage check
        if clip.source_first_frame != ref.first_frame(source.fps):
            self.report.problem(
                f"{at} camera {cam}: clip starts at source frame {clip.source_first_frame}, the "
                f"source episode at {ref.first_frame(source.fps)} of {ref.path}"
            )
            return
        self._sequential(at, entry, cam, data, ref.path)
        want = self.source_frames.get(ref.path, [clip.source_first_frame + i for i in indices])
        if clip.transform is not None:  # compare with the source frames resized the same way
            want = converter_reference(want, clip.transform)
        self.report.frames_compared += len(indices)
        for i, a, b in zip(indices, got, want):
            if clip.stream_copied:
                if np.array_equal(a, b):
                    self.report.frames_identical += 1
                else:
                    self.report.problem(
                        f"{at} camera {cam} frame {i}: stream-copied clip decodes differently from "
                        f"source frame {clip.source_first_frame + i} of {ref.path}"
                    )
            else:
                score = psnr(a, b)
                low = self.report.min_psnr_db
                self.report.min_psnr_db = score if low is None else min(low, score)
                if score < PSNR_THRESHOLD_DB:
                    self.report.problem(
                        f"{at} camera {cam} frame {i}: re-encoded clip has PSNR {score:.1f} dB "
                        f"against source frame {clip.source_first_frame + i} of {ref.path} "
                        f"(threshold {PSNR_THRESHOLD_DB:.0f} dB)"
                    )


def converter_reference(frames: np.ndarray, t: FrameTransform) -> np.ndarray:
    """Decoded RGB source frames (N, C, H, W) transformed as the converter does: in yuv420p, area
    scaling (``video.transform_frame``), back to RGB. An RGB-space resize (``transform_rgb``, the
    loader's) differs from it by 27-34 dB on small frames, below the PSNR threshold even for a
    lossless re-encode."""
    import av

    out = []
    for rgb in frames:
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb.transpose(1, 2, 0)), format="rgb24")
        out.append(transform_frame(frame, t).to_ndarray(format="rgb24").transpose(2, 0, 1))
    return np.stack(out)


def stats_against_table(entry: EpisodeEntry, table: pa.Table) -> list[str]:
    """The stats a sidecar records for an episode describe its own rows: for each numeric column,
    ``count`` is the episode's length and min/max are its rows' (within float32 rounding)."""
    if table.num_rows != entry.length:
        return []  # reported as a table of the wrong length
    problems = []
    for name, stats in sorted((entry.stats or {}).items()):
        if name not in table.column_names:
            continue  # a camera's stats: its frames are checked by decoding
        try:
            values = np.array(table.column(name).to_pylist(), dtype=np.float64).reshape(table.num_rows, -1)
        except (TypeError, ValueError):
            continue  # not numeric: LeRobot computes no stats of it
        if stats.get("count") != [entry.length]:
            problems.append(f"stats[{name!r}]['count'] = {stats.get('count')}, the episode has {entry.length} rows")
        for stat, want in (("min", values.min(axis=0)), ("max", values.max(axis=0))):
            got = np.ravel(np.array(stats.get(stat, np.nan), dtype=np.float64))
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=0.0):
                problems.append(f"stats[{name!r}][{stat!r}] is not the {stat} of its {table_member(entry.key)} rows")
    return problems


def verify_dataset(
    dest: str | Path,
    source: str | Path | None = None,
    decode_check: int = 0,
    *,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    progress: bool = False,
    legacy_format: bool = False,
    data_files_root: StorageLocation | str | None = None,
) -> VerifyReport:
    """Check every shard of a converted dataset; with ``source``, also coverage and decoded frames.

    ``decode_check`` random frames per episode and camera are decoded (and compared with the
    source's when given). Problems are collected, not raised: the report lists all of them.
    A format 1 or 2 dataset is checked, but is a problem unless ``legacy_format`` (the loader
    refuses it then too: nothing vouches that the version was not lowered by an edit).
    ``data_files_root``: where the source's parquet and mp4 files are when not beside its metadata.
    """
    out = Destination(str(dest), storage_options=storage_options)
    report = VerifyReport(dest=out.url)
    try:
        manifest = Manifest.from_json(out.read_bytes(MANIFEST_NAME), where=out.path(MANIFEST_NAME), legacy=True)
    except FileNotFoundError:
        if not bounded(out.fs, "exists", out.root):  # a wrong path, not a damaged conversion
            raise FileNotFoundError(f"{out.url}: no such file or directory") from None
        if out.exists(LEROBOT_INFO):
            report.problem(
                f"{out.url}: a raw LeRobot dataset (meta/info.json), not a conversion: verify checks convert's output"
            )
        elif out.exists(RUN_RECORD):
            report.problem(
                f"{out.path(MANIFEST_NAME)}: missing: the conversion is unfinished (run the same convert command "
                "again to resume it; after a failed array task, convert --finalize writes the manifest)"
            )
        else:
            report.problem(f"{out.url}: no conversion here (neither manifest.json nor convert.json)")
        return report
    except (FormatError, ValueError, KeyError) as e:
        report.problem(f"{out.path(MANIFEST_NAME)}: unreadable ({e})")
        return report
    if manifest.total_episodes == 0:  # a dataset nothing can train on is a failed conversion, not an OK one
        first = next(iter(sorted(manifest.skipped_episodes.items())), None)
        why = f" (all {len(manifest.skipped_episodes)} skipped; episode {first[0]}: {first[1]})" if first else ""
        report.problem(f"{out.path(MANIFEST_NAME)}: lists no episodes{why}")
    src = None
    if source is not None:
        try:
            src = LeRobotV3Source(str(source), storage_options=source_options, data_files=data_files_root)
        except SourceError as e:
            report.problem(f"source: {e}")
            return report
        for problem in manifest_against_source(manifest, src):
            report.problem(f"{out.path(MANIFEST_NAME)}: {problem}")
    if manifest.format_version < 3 and not legacy_format:
        report.problem(legacy_refusal(out.path(MANIFEST_NAME), manifest.format_version))
    elif manifest.format_version < 3:
        log.warning(
            "%s: format %d carries no digest of its metadata; edits that keep it consistent are found only "
            "with --source (re-convert for format 3)",
            out.path(MANIFEST_NAME),
            manifest.format_version,
        )
    verifier = _Verifier(out, manifest, src, decode_check, seed, report)
    found: dict[int, list[str]] = {}
    with tqdm(total=manifest.total_bytes, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        for record in manifest.shards:
            for ep in verifier.shard(record, bar):
                found.setdefault(ep, []).append(record.name)
    if manifest.sidecar_pack is not None:
        verifier.pack()
    expected = (
        {e.episode_index for e in src.episodes}
        if src is not None
        else set(range(int(manifest.source_info.get("total_episodes", 0))))
    )
    for ep, shards in sorted(found.items()):
        if len(shards) > 1:
            report.problem(f"episode {ep} appears {len(shards)} times (in {', '.join(shards)})")
        if ep in manifest.skipped_episodes:
            report.problem(f"episode {ep} is recorded as skipped but present in {shards[0]}")
    missing = sorted(expected - set(found) - set(manifest.skipped_episodes))
    if missing:
        report.problem(f"{len(missing)} source episode(s) in no shard and not recorded as skipped: {missing}")
    unknown = sorted(set(found) - expected)
    if unknown:
        report.problem(f"episode(s) {unknown} are not in the source")
    return report


def manifest_against_source(manifest: Manifest, source: LeRobotV3Source) -> list[str]:
    """Every manifest field that the source determines, compared with the source: info, stats, fps,
    tasks, cameras, features (camera shapes may differ by ``--resize``), lengths of every episode."""
    problems = []
    if manifest.source_info != source.info:
        problems.append("source_info differs from the source's meta/info.json")
    if manifest.source_stats != source.stats:
        problems.append("source_stats differs from the source's meta/stats.json")
    if manifest.fps != source.fps:
        problems.append(f"fps {manifest.fps}, the source's {source.fps}")
    if tuple(manifest.tasks) != tuple(source.tasks):
        problems.append(f"tasks {list(manifest.tasks)}, the source's {list(source.tasks)}")
    if list(manifest.cameras) != sorted(source.camera_keys):
        problems.append(f"cameras {list(manifest.cameras)}, the source's {sorted(source.camera_keys)}")
    if set(manifest.features) != set(source.features):
        problems.append(f"features {sorted(manifest.features)}, the source's {sorted(source.features)}")
    else:
        for name, spec in source.features.items():
            if name not in manifest.cameras and manifest.features[name] != spec:
                problems.append(f"features[{name!r}] differs from the source's")
    for record in manifest.shards:
        for ep, length in zip(record.episodes, record.episode_lengths):
            try:
                want = source.episode(ep).length
            except (SourceError, KeyError):
                continue  # reported by the coverage check
            if length != want:
                problems.append(
                    f"{record.name}: episode_lengths says {length} frames for episode {ep}, the source {want}"
                )
    return problems
