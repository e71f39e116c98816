"""The converted dataset's on-disk format: member names, sidecar and manifest schemas.

Both halves of the package read this module and nothing else to agree on the format, so every
name and field lives here once. Bump ``FORMAT_VERSION`` on any incompatible change; readers
refuse versions they do not know.

Versions: 1 has a sha256 per shard only. 2 adds an ``xxh3_128`` checksum per member, so a
reader that fetches one episode by byte range can check exactly those bytes (xxh3 because it
hashes at ~33 GB/s where sha256 manages ~1.3 GB/s on one core: a second hash over every copied
byte would double the converter's hashing with sha256). Version 1 shards are still read; their
members carry no checksum (``Member.xxh3_128`` is None). 3 verifies the metadata too: each
shard record carries the sha256 and size of its sidecar file, and the manifest carries
``manifest_sha256``, the sha256 of its own canonical JSON without that field (``canonical_json``),
so an edited manifest, sidecar or frame table is refused before it is used. Versions 1 and 2
are read only when asked for (``legacy=True``: the loader's ``legacy_format``, ``verify
--legacy-format``), with the structural cross-checks only (``check_manifest``, ``check_sidecar``):
an edit that keeps them consistent goes unnoticed there. Nothing in the files can vouch for their
own version (an editor who lowers it to 2 drops the digests with it), so the reader's caller does.
Format 3 conversions also write ``sidecars.pack``: every shard's sidecar file, byte for byte, in
the manifest's shard order, so one GET (or one range of it) gives a reader every sidecar it needs
instead of one request per shard. The manifest records it as ``sidecar_pack`` (its size and
sha256, covered by ``manifest_sha256``); a sidecar's slice starts where the sizes
(``sidecar_bytes``) of the records before it end (``pack_offsets``), and each slice is checked
against its record's ``sidecar_sha256`` as the sidecar file is. The sidecar files stay (older
readers, ``verify``, a pack a loader does not read whole); a manifest without ``sidecar_pack``
(an earlier format 3 conversion) is read through them.
Sidecars may record each episode's stats (``EpisodeEntry.stats``, the source's per-episode
stats), covered by the sidecar's sha256; sidecars of earlier format 3 conversions have none and
load as before (stats over an episode subset then fall back to ``meta/stats.json``).

Layout::

    OUT/manifest.json                 written last
    OUT/sidecars.pack                 every sidecar, concatenated in shard order (format 3)
    OUT/shards/shard-000000.tar       whole episodes only
    OUT/shards/shard-000000.idx.json  sidecar: byte offsets of every member, clip frame tables

Inside a tar every member of one episode shares one WebDataset key without dots::

    e000123.json                          episode metadata (EpisodeHeader)
    e000123.parquet                       its rows, with the source schema
    e000123.observation.images.front.mp4  one clip per camera, starting at timestamp 0

Camera keys contain dots; WebDataset splits a member name at the first dot, so the key stays
``e000123`` and the camera clip lands under the extension ``observation.images.front.mp4``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xxhash

from .depth import DepthError, DepthParams, depth_params
from .exceptions import LeRobotShardsError
from .names import UnsafeNameError, check_name

FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
LEGACY_VERSIONS = (1, 2)  # no metadata digests: read only when the caller asks (``legacy``)
DIGEST_FIELD = "manifest_sha256"  # format 3: sha256 of the manifest's canonical JSON without this field
FORMAT_NAME = "lerobot-shards"

MANIFEST_NAME = "manifest.json"
SIDECAR_PACK_NAME = "sidecars.pack"
SHARDS_DIR = "shards"
TMP_SUFFIX = ".tmp"
RESIZE_MODES = ("pad", "crop", "stretch")

# Bounds on what metadata may claim, so a hostile or damaged file fails at once instead of making
# a reader allocate or loop without end: far beyond any real recording, far below harm.
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
MAX_SIDECAR_BYTES = 256 * 1024 * 1024
MAX_EPISODE_FRAMES = 10_000_000  # 93 hours at 30 fps
MAX_FPS = 10_000.0
MAX_FEATURE_SIZE = 1 << 31  # values per frame of one feature (a 4K RGB frame has 2.5e7)

# Codecs a converted dataset's re-encoded clips may use, each with the FFmpeg encoder that writes it.
# The one list: the converter's options, the CLI's choices, the synthesizer and the encoder read it.
CODECS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}


class FormatError(LeRobotShardsError, ValueError):
    """A converted dataset does not match the format this version reads."""


def _int(value: object, what: str, low: int | None = 0, high: int | None = None) -> int:
    """A JSON integer in [low, high]: a float (4.9), a bool or a string is refused, not truncated."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{what} = {value!r} is not an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{'' if low is None else low}..{'' if high is None else high}"
        raise FormatError(f"{what} = {value} is out of range ({bounds})")
    return value


def _fps(value: object, what: str) -> float:
    """A frame rate: a finite number in (0, MAX_FPS]; NaN, inf, 0 and negatives are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FormatError(f"{what} = {value!r} is not a finite number")
    if not 0 < value <= MAX_FPS:
        raise FormatError(f"{what} = {value!r} is not a frame rate (0 < fps <= {MAX_FPS:g})")
    return float(value)


def _hex(value: object, what: str, length: int) -> str:
    if not isinstance(value, str) or len(value) != length or any(c not in "0123456789abcdef" for c in value):
        raise FormatError(f"{what} = {value!r} is not a {length}-digit lowercase hex digest")
    return value


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FormatError(f"{what} is not a list of strings")
    return tuple(value)


def _member_name(value: object, key: str, what: str) -> str:
    """A member name of episode ``key``: a plain name starting with ``key.`` (as every writer makes them)."""
    name = check_name(value, what)
    if not name.startswith(f"{key}."):
        raise UnsafeNameError(f"{what} = {name!r} does not belong to episode key {key!r}")
    return name


def feature_shape(spec: dict[str, Any], what: str, error: type[Exception]) -> tuple[int, ...]:
    """A feature spec's ``shape``: a non-empty list of positive sizes whose product is bounded, or ``error``.

    The loader checks every episode's columns against it, and LeRobot's ``ds.meta.shapes`` (what
    policies are built from) reports it: a shape that is no shape must fail when it is read.
    """
    shape = spec.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape)
        or math.prod(shape) > MAX_FEATURE_SIZE
    ):
        raise error(f"{what}: shape = {shape!r} is not a list of positive sizes (at most {MAX_FEATURE_SIZE} values)")
    return tuple(shape)


def episode_key(episode_index: int) -> str:
    """WebDataset key of an episode: no dots, sorts in episode order."""
    return f"e{episode_index:06d}"


def shard_name(shard_index: int) -> str:
    return f"shard-{shard_index:06d}.tar"


def sidecar_name(shard_index: int) -> str:
    return f"shard-{shard_index:06d}.idx.json"


def header_member(key: str) -> str:
    return f"{key}.json"


def table_member(key: str) -> str:
    return f"{key}.parquet"


def clip_member(key: str, camera: str) -> str:
    return f"{key}.{camera}.mp4"


def member_checksum(data: bytes | memoryview) -> str:
    """The per-member checksum of format 2 (hex xxh3-128 of the member's data bytes)."""
    return xxhash.xxh3_128_hexdigest(data)


def member_hasher() -> Any:
    """An incremental ``member_checksum``: ``update(bytes)``, then ``hexdigest()``."""
    return xxhash.xxh3_128()


@dataclass(frozen=True)
class Member:
    """Where one tar member's data lies: ``offset`` is the first data byte (after the header)."""

    name: str
    offset: int
    size: int
    xxh3_128: str | None = None  # member_checksum of the data; None in format 1 sidecars


@dataclass(frozen=True)
class FrameEntry:
    """One frame of a clip in presentation order, in the clip stream's time base."""

    pts: int
    duration: int
    key_frame: bool


@dataclass(frozen=True)
class FrameTransform:
    """How a clip's frames were made from the source's (``convert --resize``): crop, scale, pad.

    Sizes and offsets are (height, width) / (top, left) in pixels. The source region
    ``crop`` is scaled to ``scaled`` with an anti-aliased ``filter`` and placed at ``pad``
    inside a ``size`` frame filled with black: ``pad`` mode letterboxes, ``crop`` mode crops
    the source to the target aspect, ``stretch`` does neither.
    """

    mode: str  # "pad" | "crop" | "stretch"
    source: tuple[int, int]  # source frame (height, width)
    crop: tuple[int, int, int, int]  # (top, left, height, width) of the source region kept
    scaled: tuple[int, int]  # (height, width) the region is scaled to
    pad: tuple[int, int]  # (top, left) of the scaled region inside the stored frame
    size: tuple[int, int]  # stored frame (height, width)
    filter: str = "area"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "source": list(self.source),
            "crop": list(self.crop),
            "scaled": list(self.scaled),
            "pad": list(self.pad),
            "size": list(self.size),
            "filter": self.filter,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrameTransform:
        def ints(key: str, n: int) -> tuple[int, ...]:
            value = tuple(int(v) for v in d[key])
            if len(value) != n or min(value) < 0:
                raise FormatError(f"frame transform field {key!r}: expected {n} non-negative ints, got {d[key]!r}")
            return value

        if d.get("mode") not in RESIZE_MODES:
            raise FormatError(f"frame transform mode {d.get('mode')!r} is not one of {', '.join(RESIZE_MODES)}")
        t = cls(
            mode=str(d["mode"]),
            source=ints("source", 2),  # type: ignore[arg-type]
            crop=ints("crop", 4),  # type: ignore[arg-type]
            scaled=ints("scaled", 2),  # type: ignore[arg-type]
            pad=ints("pad", 2),  # type: ignore[arg-type]
            size=ints("size", 2),  # type: ignore[arg-type]
            filter=str(d.get("filter", "area")),
        )
        (sh, sw), (ct, cl, ch, cw), (h, w), (pt, pl), (th, tw) = t.source, t.crop, t.scaled, t.pad, t.size
        if min(ch, cw, h, w) < 1 or ct + ch > sh or cl + cw > sw or pt + h > th or pl + w > tw:
            raise FormatError(
                f"frame transform {t.to_dict()}: crop outside the source or scaled frame outside the stored one"
            )
        return t


@dataclass(frozen=True)
class ClipInfo:
    """Facts about one camera clip, enough to decode any frame exactly without scanning."""

    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    num_frames: int
    time_base: tuple[int, int]  # (numerator, denominator) of the stream time base
    frames: tuple[FrameEntry, ...]  # presentation order; len == num_frames
    stream_copied: bool  # True: packets bit-identical to the source; False: re-encoded
    source_first_frame: int  # index of clip frame 0 in the source mp4 (frame count order)
    transform: FrameTransform | None = None  # how frames were resized from the source's; None: as in the source

    def key_frame_indices(self) -> list[int]:
        return [i for i, f in enumerate(self.frames) if f.key_frame]

    def frame_mappings_json(self) -> str:
        """torchcodec ``custom_frame_mappings``: exact seeks without a file scan."""
        return json.dumps(
            {"frames": [{"pts": f.pts, "duration": f.duration, "key_frame": int(f.key_frame)} for f in self.frames]}
        )

    def to_dict(self) -> dict[str, Any]:
        # Field by field in declaration order: dataclasses.asdict would deep-copy every FrameEntry.
        return {
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "pix_fmt": self.pix_fmt,
            "fps": self.fps,
            "num_frames": self.num_frames,
            "time_base": list(self.time_base),
            # Compact frame table: three parallel lists keep sidecars small for long episodes.
            "frames": {
                "pts": [f.pts for f in self.frames],
                "duration": [f.duration for f in self.frames],
                "key_frame": [int(f.key_frame) for f in self.frames],
            },
            "stream_copied": self.stream_copied,
            "source_first_frame": self.source_first_frame,
            # Only when resized: sidecars of other conversions keep the bytes they always had.
            **({"transform": self.transform.to_dict()} if self.transform is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], at: str = "clip") -> ClipInfo:
        """Parse one clip's facts; the frame table must be what a demuxer gives: ``num_frames`` entries,
        pts strictly increasing (presentation order), durations not negative, a key frame first."""
        fr = d["frames"]
        pts, durations, keys = fr["pts"], fr["duration"], fr["key_frame"]
        num_frames = _int(d["num_frames"], f"{at}.num_frames", 1, MAX_EPISODE_FRAMES)
        for name, column in (("pts", pts), ("duration", durations), ("key_frame", keys)):
            if not isinstance(column, list) or len(column) != num_frames:
                raise FormatError(f"{at}.frames.{name} does not hold num_frames = {num_frames} entries")
        if not all(type(p) is int for p in pts) or not all(type(du) is int and du >= 0 for du in durations):
            raise FormatError(f"{at}.frames: pts and durations must be integers (durations not negative)")
        if any(b <= a for a, b in zip(pts, pts[1:])):
            raise FormatError(f"{at}.frames.pts is not strictly increasing (frames out of presentation order)")
        if keys[0] not in (1, True) or not all(k in (0, 1) for k in keys):
            raise FormatError(f"{at}.frames.key_frame must be 0/1 flags starting with a key frame")
        frames = tuple(FrameEntry(p, du, bool(k)) for p, du, k in zip(pts, durations, keys))
        info = cls(
            codec=d["codec"],
            width=_int(d["width"], f"{at}.width", 1, 1 << 16),
            height=_int(d["height"], f"{at}.height", 1, 1 << 16),
            pix_fmt=d["pix_fmt"],
            fps=_fps(d["fps"], f"{at}.fps"),
            num_frames=num_frames,
            time_base=(_int(d["time_base"][0], f"{at}.time_base", 1), _int(d["time_base"][1], f"{at}.time_base", 1)),
            frames=frames,
            stream_copied=bool(d["stream_copied"]),
            source_first_frame=_int(d["source_first_frame"], f"{at}.source_first_frame"),
            transform=FrameTransform.from_dict(d["transform"]) if d.get("transform") else None,
        )
        if info.transform is not None and info.transform.size != (info.height, info.width):
            raise FormatError(f"clip is {info.width}x{info.height} but its transform stores {info.transform.size}")
        return info


@dataclass(frozen=True)
class EpisodeHeader:
    """Content of ``<key>.json``: what a reader needs to use the episode's other members."""

    episode_index: int
    length: int
    tasks: tuple[str, ...]
    fps: float
    cameras: tuple[str, ...]
    dataset_from_index: int  # global ``index`` of the episode's first row in the source

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tasks"] = list(self.tasks)
        d["cameras"] = list(self.cameras)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeHeader:
        return cls(
            episode_index=_int(d["episode_index"], "episode_index"),
            length=_int(d["length"], "length", 1, MAX_EPISODE_FRAMES),
            tasks=_strings(d["tasks"], "tasks"),
            fps=_fps(d["fps"], "fps"),
            cameras=tuple(check_name(c, f"cameras[{i}]") for i, c in enumerate(d["cameras"])),
            dataset_from_index=_int(d["dataset_from_index"], "dataset_from_index"),
        )


@dataclass(frozen=True)
class EpisodeEntry:
    """One episode inside a shard, as the sidecar records it."""

    key: str
    episode_index: int
    length: int
    members: dict[str, Member]  # by member name
    clips: dict[str, ClipInfo]  # by camera key
    # The source's stats of this episode (its meta/episodes ``stats/<feature>/<stat>`` columns, as
    # nested JSON lists: {feature: {stat: values}}), so stats over any episode subset can be
    # aggregated as LeRobot aggregates them. None: the source had none, or an older converter.
    stats: dict[str, dict[str, Any]] | None = None

    def span(self) -> tuple[int, int]:
        """(start, end) byte range covering all members: one ranged read fetches the episode."""
        start = min(m.offset for m in self.members.values())
        end = max(m.offset + m.size for m in self.members.values())
        return start, end

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "episode_index": self.episode_index,
            "length": self.length,
            "members": [asdict(m) for m in self.members.values()],
            "clips": {cam: c.to_dict() for cam, c in self.clips.items()},
            **({"stats": self.stats} if self.stats is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], at: str = "episode", *, checksums: bool = True) -> EpisodeEntry:
        """Parse and confine names: ``at`` names this entry in errors (``episodes[3]``).

        ``checksums``: members must carry one (format 2 and later).
        """
        key = check_name(d["key"], f"{at}.key")
        if "." in key:
            raise UnsafeNameError(f"{at}.key = {key!r} contains a dot; episode keys have none")
        members = {}
        for i, m in enumerate(d["members"]):
            name = _member_name(m["name"], key, f"{at}.members[{i}].name")
            checksum = m["xxh3_128"] if checksums else None
            if checksums and not isinstance(checksum, str):
                raise ValueError(f"{at}.members[{i}].xxh3_128 = {checksum!r} is not a hex string")
            if checksums:
                _hex(checksum, f"{at}.members[{i}].xxh3_128", 32)
            if name in members:
                raise FormatError(f"{at}.members[{i}].name = {name!r} is listed twice")
            offset = _int(m["offset"], f"{at}.members[{i}].offset")
            members[name] = Member(name, offset, _int(m["size"], f"{at}.members[{i}].size"), checksum)
        if not members:
            raise FormatError(f"{at}.members is empty")
        return cls(
            key=key,
            episode_index=_int(d["episode_index"], f"{at}.episode_index"),
            length=_int(d["length"], f"{at}.length", 1, MAX_EPISODE_FRAMES),
            members=members,
            clips={
                check_name(cam, f"{at}.clips key"): ClipInfo.from_dict(c, f"{at}.clips[{cam!r}]")
                for cam, c in d["clips"].items()
            },
            stats=episode_stats(d["stats"], f"{at}.stats") if "stats" in d else None,
        )


def episode_stats(value: object, what: str) -> dict[str, dict[str, Any]]:
    """An episode's stats as a sidecar holds them: {feature: {stat: a numeric array as nested lists}},
    ``count`` one non-negative integer, every other stat of one feature the same shape."""
    if not isinstance(value, dict):
        raise FormatError(f"{what} is not a JSON object")
    for feature, stats in value.items():
        at = f"{what}[{feature!r}]"
        if not isinstance(stats, dict) or not stats:
            raise FormatError(f"{at} is not a non-empty object of stats")
        shapes = set()
        for name, values in stats.items():
            array = np.array(values) if isinstance(values, list) else None
            if array is None or array.dtype.kind not in "iuf" or array.ndim == 0 or array.size == 0:
                raise FormatError(f"{at}[{name!r}] is not a non-empty array of numbers")
            if name == "count":
                if array.shape != (1,) or array.dtype.kind not in "iu" or array[0] < 0:
                    raise FormatError(f"{at}['count'] = {values!r} is not one frame count")
            else:
                shapes.add(array.shape)
        if len(shapes) > 1:
            raise FormatError(f"{at}: its stats have different shapes {sorted(shapes)}")
    return value


@dataclass(frozen=True)
class Sidecar:
    """``shard-XXXXXX.idx.json``: the index of one tar shard."""

    shard: str  # tar file name, relative to the shards dir
    size: int  # tar size in bytes
    sha256: str
    episodes: tuple[EpisodeEntry, ...]
    format_version: int = FORMAT_VERSION
    skipped: dict[int, str] = field(default_factory=dict)  # planned here but left out: episode -> reason

    @property
    def num_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_NAME,
                "format_version": self.format_version,
                "shard": self.shard,
                "size": self.size,
                "sha256": self.sha256,
                "episodes": [e.to_dict() for e in self.episodes],
                "skipped": {str(k): v for k, v in sorted(self.skipped.items())},
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "sidecar") -> Sidecar:
        d = _load(text, where)
        with _naming(where):
            return cls(
                shard=check_name(d["shard"], "shard"),
                size=_int(d["size"], "size"),
                sha256=_hex(d["sha256"], "sha256", 64),
                episodes=tuple(
                    EpisodeEntry.from_dict(e, f"episodes[{i}]", checksums=d["format_version"] >= 2)
                    for i, e in enumerate(d["episodes"])
                ),
                format_version=int(d["format_version"]),
                skipped={int(k): v for k, v in d.get("skipped", {}).items()},
            )


@dataclass(frozen=True)
class ShardRecord:
    """The manifest's line for one shard."""

    index: int
    name: str  # tar name, relative to the shards dir
    sidecar: str
    episodes: tuple[int, ...]
    frames: int
    bytes: int
    sha256: str
    episode_lengths: tuple[int, ...] = ()  # frames per episode, same order (loaders plan without sidecars)
    sidecar_sha256: str | None = None  # format 3: sha256 of the sidecar file's bytes
    sidecar_bytes: int | None = None  # format 3: its size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["episodes"] = list(self.episodes)
        d["episode_lengths"] = list(self.episode_lengths)
        if self.sidecar_sha256 is None:
            del d["sidecar_sha256"], d["sidecar_bytes"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], at: str = "shard", *, digests: bool = True) -> ShardRecord:
        """``digests``: the record must carry its sidecar's sha256 and size (format 3 and later)."""
        return cls(
            index=_int(d["index"], f"{at}.index"),
            name=check_name(d["name"], f"{at}.name"),
            sidecar=check_name(d["sidecar"], f"{at}.sidecar"),
            episodes=tuple(_int(e, f"{at}.episodes[{i}]") for i, e in enumerate(d["episodes"])),
            frames=_int(d["frames"], f"{at}.frames"),
            bytes=_int(d["bytes"], f"{at}.bytes", 1),
            sha256=_hex(d["sha256"], f"{at}.sha256", 64),
            episode_lengths=tuple(
                _int(n, f"{at}.episode_lengths[{i}]", 1, MAX_EPISODE_FRAMES)
                for i, n in enumerate(d.get("episode_lengths", ()))
            ),
            sidecar_sha256=_hex(d["sidecar_sha256"], f"{at}.sidecar_sha256", 64) if digests else None,
            sidecar_bytes=_int(d["sidecar_bytes"], f"{at}.sidecar_bytes", 1, MAX_SIDECAR_BYTES) if digests else None,
        )


@dataclass(frozen=True)
class PackRecord:
    """The manifest's line for ``sidecars.pack``: every sidecar's bytes in shard order."""

    name: str
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, d: object, at: str = "sidecar_pack") -> PackRecord:
        if not isinstance(d, dict):
            raise FormatError(f"{at} is not a JSON object")
        return cls(
            name=check_name(d["name"], f"{at}.name"),
            bytes=_int(d["bytes"], f"{at}.bytes"),
            sha256=_hex(d["sha256"], f"{at}.sha256", 64),
        )


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: written last; its presence marks a complete conversion."""

    source_info: dict[str, Any]  # the source's meta/info.json, verbatim
    source_stats: dict[str, Any]  # meta/stats.json, verbatim ({} when absent)
    tasks: tuple[str, ...]  # task string by task_index
    fps: float
    features: dict[str, Any]  # feature name -> feature spec (as in info.json)
    cameras: tuple[str, ...]
    video: dict[str, Any]  # video settings used: {"mode": "copy"|"reencode", "codec", "gop", "crf"}
    shards: tuple[ShardRecord, ...]
    skipped_episodes: dict[int, str] = field(default_factory=dict)  # episode -> reason
    converter: dict[str, Any] = field(default_factory=dict)  # {"version", "arguments"}
    format_version: int = FORMAT_VERSION
    # Cameras converted with --resize: camera -> the FrameTransform of its clips (the first
    # episode's; sidecars hold each clip's). ``features`` then carries the stored shape.
    transforms: dict[str, FrameTransform] = field(default_factory=dict)
    # Depth cameras (LeRobot's is_depth_map): camera -> the quantizer their 12-bit codes are read with
    # and the unit their stats are in, resolved as LeRobot resolves them from the feature's info.
    depth: dict[str, DepthParams] = field(default_factory=dict)
    # Format 3: every sidecar in one object (``sidecars.pack``); None in earlier conversions.
    sidecar_pack: PackRecord | None = None

    @property
    def total_episodes(self) -> int:
        return sum(len(s.episodes) for s in self.shards)

    @property
    def total_frames(self) -> int:
        return sum(s.frames for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        """The manifest's JSON; from format 3 on it carries ``manifest_sha256`` of its canonical form."""
        d = self._to_dict()
        if self.format_version >= 3:
            d[DIGEST_FIELD] = manifest_digest(json.loads(json.dumps(d)))  # the digest a reader will compute
        return json.dumps(d, indent=1)

    def _to_dict(self) -> dict[str, Any]:
        return dict(
            {
                "format": FORMAT_NAME,
                "format_version": self.format_version,
                "fps": self.fps,
                "cameras": list(self.cameras),
                "features": self.features,
                "tasks": list(self.tasks),
                "video": self.video,
                "totals": {
                    "episodes": self.total_episodes,
                    "frames": self.total_frames,
                    "bytes": self.total_bytes,
                    "shards": len(self.shards),
                },
                "shards": [s.to_dict() for s in self.shards],
                "skipped_episodes": {str(k): v for k, v in sorted(self.skipped_episodes.items())},
                "converter": self.converter,
                **({"transforms": {c: t.to_dict() for c, t in self.transforms.items()}} if self.transforms else {}),
                **({"depth": {c: p.to_dict() for c, p in self.depth.items()}} if self.depth else {}),
                **({"sidecar_pack": asdict(self.sidecar_pack)} if self.sidecar_pack else {}),
                "source_info": self.source_info,
                "source_stats": self.source_stats,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = MANIFEST_NAME, legacy: bool = False) -> Manifest:
        """Parse, check the digest (format 3) and cross-check every field (``check_manifest``).

        A format without digests (``LEGACY_VERSIONS``) is refused unless ``legacy``: lowering the
        version in an edited manifest must not switch its checks off unnoticed.
        """
        d = _load(text, where)
        version = d["format_version"]
        if version in LEGACY_VERSIONS and not legacy:
            raise FormatError(legacy_refusal(where, version))
        if version >= 3:
            stored = d.get(DIGEST_FIELD)
            if stored != manifest_digest(d):
                raise FormatError(
                    f"{where}: content does not match its {DIGEST_FIELD} ({'missing' if stored is None else stored!r}):"
                    " the manifest was edited or damaged after conversion; restore it or re-convert the dataset"
                )
        with _naming(where):
            for name, kind in (("source_info", dict), ("features", dict), ("video", dict), ("shards", list)):
                if not isinstance(d[name], kind):
                    raise FormatError(f"{name} is not a JSON {'object' if kind is dict else 'array'}")
            manifest = cls(
                source_info=d["source_info"],
                source_stats=d.get("source_stats", {}),
                tasks=_strings(d["tasks"], "tasks"),
                fps=_fps(d["fps"], "fps"),
                features=d["features"],
                cameras=tuple(check_name(c, f"cameras[{i}]") for i, c in enumerate(d["cameras"])),
                video=d["video"],
                shards=tuple(
                    ShardRecord.from_dict(s, f"shards[{i}]", digests=version >= 3) for i, s in enumerate(d["shards"])
                ),
                skipped_episodes={
                    _int(int(k) if isinstance(k, str) and k.isdigit() else k, f"skipped_episodes key {k!r}"): v
                    for k, v in d.get("skipped_episodes", {}).items()
                },
                converter=d.get("converter", {}),
                format_version=int(version),
                transforms={c: FrameTransform.from_dict(t) for c, t in d.get("transforms", {}).items()},
                depth=_depth_records(d.get("depth", {})),
                # an older format has no sidecar sizes, so no place of a sidecar in a pack: read without it
                sidecar_pack=PackRecord.from_dict(d["sidecar_pack"]) if "sidecar_pack" in d and version >= 3 else None,
            )
            check_manifest(manifest, d.get("totals"))
        return manifest


def _depth_records(d: Any) -> dict[str, DepthParams]:
    if not isinstance(d, dict):
        raise FormatError("depth is not a JSON object")
    try:
        return {str(c): DepthParams.from_dict(p, f"depth[{c!r}]") for c, p in d.items()}
    except DepthError as e:
        raise FormatError(str(e)) from None


def legacy_refusal(where: str, version: int) -> str:
    """Why a format 1 or 2 manifest is not read unless asked for, and how to ask."""
    return (
        f"{where}: format_version {version} carries no digests of its metadata (an edit that lowers the version "
        "switches them off); read it only if you trust it: legacy_format=True (verify --legacy-format), or "
        "re-convert the dataset"
    )


def canonical_json(d: dict[str, Any]) -> bytes:
    """The bytes a manifest digest covers: sorted keys, no spaces, ASCII; ``DIGEST_FIELD`` left out."""
    body = {k: v for k, v in d.items() if k != DIGEST_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_digest(d: dict[str, Any]) -> str:
    """sha256 of a parsed manifest's ``canonical_json``: the same for any whitespace or key order."""
    return hashlib.sha256(canonical_json(d)).hexdigest()


def sidecar_digest(data: bytes) -> str:
    """What a format 3 shard record stores as ``sidecar_sha256``: sha256 of the sidecar file's bytes."""
    return hashlib.sha256(data).hexdigest()


def check_manifest(m: Manifest, totals: object = None) -> None:
    """Every field agrees with the others: cameras are the video features, fps and features match the
    source's ``info.json`` kept verbatim, shards and episodes are listed once each, lengths add up to
    frames and are bounded by the bytes that hold them, and the written totals match. Raises
    ``FormatError`` naming the field (the caller adds the file)."""
    videos = sorted(k for k, v in m.features.items() if isinstance(v, dict) and v.get("dtype") == "video")
    if any(not isinstance(v, dict) or not isinstance(v.get("dtype"), str) for v in m.features.values()):
        raise FormatError("features: every feature needs a spec with a dtype")
    if list(m.cameras) != videos:
        raise FormatError(f"cameras = {list(m.cameras)} are not the video features {videos}")
    info_features = m.source_info.get("features")
    if isinstance(info_features, dict):
        if set(info_features) != set(m.features):
            raise FormatError(f"features {sorted(m.features)} differ from source_info.features {sorted(info_features)}")
        for name, spec in m.features.items():
            src = info_features[name]
            if not isinstance(src, dict) or src.get("dtype") != spec["dtype"]:
                raise FormatError(f"features[{name!r}] has another dtype than source_info.features[{name!r}]")
            if name not in m.cameras and src != spec:
                raise FormatError(f"features[{name!r}] differs from source_info.features[{name!r}]")
    for name, spec in m.features.items():
        feature_shape(spec, f"features[{name!r}]", FormatError)
    if "fps" in m.source_info and m.source_info["fps"] != m.fps:
        raise FormatError(f"fps = {m.fps!r}, source_info.fps = {m.source_info['fps']!r}")
    if len(set(m.tasks)) != len(m.tasks):
        raise FormatError("tasks lists a task twice")
    for cam in m.transforms:
        if cam not in m.cameras:
            raise FormatError(f"transforms names {cam!r}, which is not a camera")
        if cam in m.depth:
            raise FormatError(f"transforms names {cam!r}, a depth camera (never resized)")
    try:
        declared = {c: p for c in m.cameras if (p := depth_params(m.features[c], f"features[{c!r}]")) is not None}
    except DepthError as e:
        raise FormatError(str(e)) from None
    if declared != m.depth:
        raise FormatError(
            f"depth records {sorted(m.depth)}, which differ from the depth cameras' features {sorted(declared)}"
        )
    seen: dict[int, int] = {}
    for what, values in (("index", [s.index for s in m.shards]), ("name", [s.name for s in m.shards])):
        if len(set(values)) != len(values):
            raise FormatError(f"shards: two records share one {what}")
    if len({s.sidecar for s in m.shards}) != len(m.shards):
        raise FormatError("shards: two records share one sidecar")
    for i, s in enumerate(m.shards):
        at = f"shards[{i}]"
        for ep in s.episodes:
            if ep in seen:
                raise FormatError(f"{at}.episodes: episode {ep} is also in shards[{seen[ep]}]")
            if ep in m.skipped_episodes:
                raise FormatError(f"{at}.episodes: episode {ep} is also recorded as skipped")
            seen[ep] = i
        if s.episode_lengths or m.format_version >= 3:
            if len(s.episode_lengths) != len(s.episodes):
                raise FormatError(f"{at}: {len(s.episode_lengths)} episode_lengths for {len(s.episodes)} episodes")
            if sum(s.episode_lengths) != s.frames:
                raise FormatError(f"{at}: episode_lengths add up to {sum(s.episode_lengths)}, frames = {s.frames}")
        if not s.episodes:
            raise FormatError(f"{at}.episodes is empty")
        if s.frames > s.bytes:  # every frame takes bytes of table and video: the size bounds the count
            raise FormatError(f"{at}: frames = {s.frames} cannot fit in its {s.bytes} bytes")
    total = m.source_info.get("total_episodes")
    if type(total) is int:  # a conversion covers its whole source: each episode in a shard or skipped
        listed = set(seen) | set(m.skipped_episodes)
        extra = sorted(e for e in listed if e >= total)
        # never range(total) whole: a total_episodes of 10**12 must fail, not fill memory
        gaps = (
            []
            if extra or len(listed) >= total
            else list(itertools.islice((e for e in range(total) if e not in listed), 10))
        )
        if gaps or extra:
            raise FormatError(
                f"shards: episodes {gaps or extra} of source_info.total_episodes = {total} are "
                + ("in no shard and not recorded as skipped" if gaps else "not in the source")
            )
    if m.sidecar_pack is not None and m.sidecar_pack.bytes != sum(s.sidecar_bytes or 0 for s in m.shards):
        raise FormatError(
            f"sidecar_pack.bytes = {m.sidecar_pack.bytes}, the shards' sidecar_bytes add up to "
            f"{sum(s.sidecar_bytes or 0 for s in m.shards)}"
        )
    if isinstance(totals, dict):
        want = {"episodes": m.total_episodes, "frames": m.total_frames, "bytes": m.total_bytes, "shards": len(m.shards)}
        for key, value in want.items():
            if key in totals and totals[key] != value:
                raise FormatError(f"totals.{key} = {totals[key]!r}, the shards add up to {value}")


def pack_offsets(m: Manifest) -> dict[int, tuple[int, int]]:
    """Where each shard's sidecar lies in ``sidecars.pack``: shard index -> (start, end), the
    records' ``sidecar_bytes`` summed in the manifest's order (format 3)."""
    out: dict[int, tuple[int, int]] = {}
    at = 0
    for s in m.shards:
        if s.sidecar_bytes is None:
            raise FormatError(f"shard {s.index}: no sidecar_bytes, so no place in {SIDECAR_PACK_NAME}")
        out[s.index] = (at, at + s.sidecar_bytes)
        at += s.sidecar_bytes
    return out


def check_sidecar(sidecar: Sidecar, record: ShardRecord, manifest: Manifest) -> None:
    """The sidecar is the one the manifest's ``record`` describes: same tar, size, sha256, episodes
    and lengths; every episode has exactly its header, table and one clip per manifest camera, each
    member inside the tar, each clip ``length`` frames. Raises ``FormatError`` naming the field."""
    if sidecar.format_version != manifest.format_version:  # a sidecar cannot opt out of checksums
        raise FormatError(f"format_version {sidecar.format_version}, but the manifest's is {manifest.format_version}")
    if (sidecar.shard, sidecar.size, sidecar.sha256) != (record.name, record.bytes, record.sha256):
        raise FormatError(
            f"describes {sidecar.shard} of {sidecar.size} bytes (sha256 {sidecar.sha256[:12]}...), the manifest "
            f"{record.name} of {record.bytes} bytes (sha256 {record.sha256[:12]}...)"
        )
    listed = tuple(e.episode_index for e in sidecar.episodes)
    if listed != record.episodes:
        raise FormatError(f"lists episodes {list(listed)}, the manifest {list(record.episodes)}")
    lengths = tuple(e.length for e in sidecar.episodes)
    if record.episode_lengths and lengths != record.episode_lengths:
        raise FormatError(
            f"episode lengths {list(lengths)}, the manifest's episode_lengths {list(record.episode_lengths)}"
        )
    cameras = set(manifest.cameras)
    for i, e in enumerate(sidecar.episodes):
        at = f"episodes[{i}] (episode {e.episode_index})"
        if e.key != episode_key(e.episode_index):
            raise FormatError(f"{at}.key = {e.key!r}, expected {episode_key(e.episode_index)!r}")
        if set(e.clips) != cameras:
            raise FormatError(f"{at}: clips for {sorted(e.clips)}, the manifest's cameras are {sorted(cameras)}")
        want = {header_member(e.key), table_member(e.key)} | {clip_member(e.key, c) for c in cameras}
        if set(e.members) != want:
            raise FormatError(f"{at}: members {sorted(e.members)}, expected {sorted(want)}")
        for m in e.members.values():
            if m.offset < 512 or m.offset + m.size > sidecar.size:  # after its 512-byte tar header, inside the tar
                raise FormatError(
                    f"{at}: member {m.name} at {m.offset}+{m.size} lies outside the {sidecar.size}-byte tar"
                )
        for cam, clip in e.clips.items():
            if clip.num_frames != e.length:
                raise FormatError(f"{at}: clip {cam} has {clip.num_frames} frames, the episode {e.length}")
        unknown = sorted(set(e.stats or ()) - set(manifest.features))
        if unknown:
            raise FormatError(f"{at}: stats for {unknown}, which are not features of the dataset")


def check_episode_header(header: EpisodeHeader, entry: EpisodeEntry, manifest: Manifest) -> None:
    """An episode's own ``<key>.json`` (inside the checksummed tar) agrees with sidecar and manifest."""
    if (header.episode_index, header.length) != (entry.episode_index, entry.length):
        raise FormatError(
            f"{header_member(entry.key)} says episode {header.episode_index} of {header.length} frames, "
            f"the sidecar episode {entry.episode_index} of {entry.length}"
        )
    if header.fps != manifest.fps:
        raise FormatError(f"{header_member(entry.key)} says fps {header.fps}, the manifest {manifest.fps}")
    if sorted(header.cameras) != sorted(manifest.cameras):
        raise FormatError(
            f"{header_member(entry.key)} lists cameras {sorted(header.cameras)}, the manifest {sorted(manifest.cameras)}"
        )
    unknown = [t for t in header.tasks if t not in manifest.tasks]
    if unknown:
        raise FormatError(f"{header_member(entry.key)} has tasks {unknown} that the manifest's tasks do not list")


def _load(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:  # [[[[...]]]] 100,000 deep: the parser's own limit, named with the file
        raise FormatError(f"{where}: nested too deeply to be a {FORMAT_NAME} file") from None
    if not isinstance(d, dict):
        raise FormatError(f"{where}: not a {FORMAT_NAME} file (a JSON {type(d).__name__}, not an object)")
    check_version(d, where)
    return d


@contextlib.contextmanager
def _naming(where: str) -> Iterator[None]:
    """Turn a bad field anywhere in a parsed file into one FormatError naming the file (and field)."""
    try:
        yield
    except (UnsafeNameError, FormatError) as e:
        raise FormatError(f"{where}: {e}") from None
    except KeyError as e:
        raise FormatError(f"{where}: missing field {e}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        raise FormatError(f"{where}: malformed ({type(e).__name__}: {e})") from None


def check_version(d: dict[str, Any], where: str) -> None:
    if d.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: not a {FORMAT_NAME} file (format={d.get('format')!r})")
    v = d.get("format_version")
    if type(v) is not int or v not in READABLE_VERSIONS:
        raise FormatError(
            f"{where}: format_version {v!r} is not supported by this version of lerobot-shards "
            f"(reads {', '.join(map(str, READABLE_VERSIONS))}); re-convert the dataset or upgrade lerobot-shards"
        )
