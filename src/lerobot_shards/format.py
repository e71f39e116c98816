"""The converted dataset's on-disk format: member names, sidecar and manifest schemas.

Both halves of the package read this module and nothing else to agree on the format, so every
name and field lives here once. Bump ``FORMAT_VERSION`` on any incompatible change; readers
refuse versions they do not know.

Versions: 1 has a sha256 per shard only. 2 adds an ``xxh3_128`` checksum per member, so a
reader that fetches one episode by byte range can check exactly those bytes (xxh3 because it
hashes at ~33 GB/s where sha256 manages ~1.3 GB/s on one core: a second hash over every copied
byte would double the converter's hashing with sha256). Version 1 shards are still read; their
members carry no checksum (``Member.xxh3_128`` is None).

Layout::

    OUT/manifest.json                 written last
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
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import xxhash

from .exceptions import LeRobotShardsError
from .names import UnsafeNameError, check_name

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FORMAT_NAME = "lerobot-shards"

MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "shards"
TMP_SUFFIX = ".tmp"
RESIZE_MODES = ("pad", "crop", "stretch")

# Codecs a converted dataset's re-encoded clips may use, each with the FFmpeg encoder that writes it.
# The one list: the converter's options, the CLI's choices, the synthesizer and the encoder read it.
CODECS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}


class FormatError(LeRobotShardsError, ValueError):
    """A converted dataset does not match the format this version reads."""


def _member_name(value: object, key: str, what: str) -> str:
    """A member name of episode ``key``: a plain name starting with ``key.`` (as every writer makes them)."""
    name = check_name(value, what)
    if not name.startswith(f"{key}."):
        raise UnsafeNameError(f"{what} = {name!r} does not belong to episode key {key!r}")
    return name


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
    def from_dict(cls, d: dict[str, Any]) -> ClipInfo:
        fr = d["frames"]
        frames = tuple(
            FrameEntry(int(p), int(du), bool(k)) for p, du, k in zip(fr["pts"], fr["duration"], fr["key_frame"])
        )
        info = cls(
            codec=d["codec"],
            width=int(d["width"]),
            height=int(d["height"]),
            pix_fmt=d["pix_fmt"],
            fps=float(d["fps"]),
            num_frames=int(d["num_frames"]),
            time_base=(int(d["time_base"][0]), int(d["time_base"][1])),
            frames=frames,
            stream_copied=bool(d["stream_copied"]),
            source_first_frame=int(d["source_first_frame"]),
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
            episode_index=int(d["episode_index"]),
            length=int(d["length"]),
            tasks=tuple(d["tasks"]),
            fps=float(d["fps"]),
            cameras=tuple(check_name(c, f"cameras[{i}]") for i, c in enumerate(d["cameras"])),
            dataset_from_index=int(d["dataset_from_index"]),
        )


@dataclass(frozen=True)
class EpisodeEntry:
    """One episode inside a shard, as the sidecar records it."""

    key: str
    episode_index: int
    length: int
    members: dict[str, Member]  # by member name
    clips: dict[str, ClipInfo]  # by camera key

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
            members[name] = Member(name, int(m["offset"]), int(m["size"]), checksum)
        return cls(
            key=key,
            episode_index=int(d["episode_index"]),
            length=int(d["length"]),
            members=members,
            clips={check_name(cam, f"{at}.clips key"): ClipInfo.from_dict(c) for cam, c in d["clips"].items()},
        )


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
                size=int(d["size"]),
                sha256=d["sha256"],
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["episodes"] = list(self.episodes)
        d["episode_lengths"] = list(self.episode_lengths)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], at: str = "shard") -> ShardRecord:
        return cls(
            index=int(d["index"]),
            name=check_name(d["name"], f"{at}.name"),
            sidecar=check_name(d["sidecar"], f"{at}.sidecar"),
            episodes=tuple(int(e) for e in d["episodes"]),
            frames=int(d["frames"]),
            bytes=int(d["bytes"]),
            sha256=d["sha256"],
            episode_lengths=tuple(int(n) for n in d.get("episode_lengths", ())),
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
        return json.dumps(
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
                "source_info": self.source_info,
                "source_stats": self.source_stats,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        d = _load(text, where)
        with _naming(where):
            return cls(
                source_info=d["source_info"],
                source_stats=d.get("source_stats", {}),
                tasks=tuple(d["tasks"]),
                fps=float(d["fps"]),
                features=d["features"],
                cameras=tuple(check_name(c, f"cameras[{i}]") for i, c in enumerate(d["cameras"])),
                video=d["video"],
                shards=tuple(ShardRecord.from_dict(s, f"shards[{i}]") for i, s in enumerate(d["shards"])),
                skipped_episodes={int(k): v for k, v in d.get("skipped_episodes", {}).items()},
                converter=d.get("converter", {}),
                format_version=int(d["format_version"]),
                transforms={c: FrameTransform.from_dict(t) for c, t in d.get("transforms", {}).items()},
            )


def _load(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise FormatError(f"{where}: not a {FORMAT_NAME} file (a JSON {type(d).__name__}, not an object)")
    check_version(d, where)
    return d


@contextlib.contextmanager
def _naming(where: str) -> Iterator[None]:
    """Turn a bad field anywhere in a parsed file into one FormatError naming the file (and field)."""
    try:
        yield
    except UnsafeNameError as e:
        raise FormatError(f"{where}: {e}") from None
    except KeyError as e:
        raise FormatError(f"{where}: missing field {e}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        raise FormatError(f"{where}: malformed ({type(e).__name__}: {e})") from None


def check_version(d: dict[str, Any], where: str) -> None:
    if d.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: not a {FORMAT_NAME} file (format={d.get('format')!r})")
    v = d.get("format_version")
    if v not in READABLE_VERSIONS:
        raise FormatError(
            f"{where}: format_version {v} is not supported by this version of lerobot-shards "
            f"(reads {', '.join(map(str, READABLE_VERSIONS))}); re-convert the dataset or upgrade lerobot-shards"
        )
