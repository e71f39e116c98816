"""What a conversion will produce: its options, its shard plan, and each task's share of it.

Pure: everything here follows from the source metadata and the options, so every process,
task and re-run computes the same plan and can tell its own output from foreign content.
The options' defaults and choices live here (and in ``format.CODECS``, ``shard_plan``) once:
the CLI reads them from this module, which is why it imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

from ..format import CODECS
from ..resize import DEFAULT_MODE, camera_sizes, check_mode, check_size
from ..shard_plan import PlannedShard, plan_shards, shard_target

if TYPE_CHECKING:
    from ..lerobot_v3 import LeRobotV3Source

# g=2 as LeRobot itself encodes: a random frame costs ~1.5 decoded frames, which is what
# training with random (episode, frame, delta) access needs; sequential readers lose little.
DEFAULT_GOP = 2
# Visually lossless-ish defaults per codec (libx264/libx265 CRF scales differ from SVT-AV1's).
DEFAULT_CRF = {"h264": 18, "hevc": 20, "av1": 30}
# Stream-copy mode re-encodes off-keyframe episodes with this, and --resize without --reencode
# stores resized cameras in it: fast to encode, decoded by NVDEC, and at training sizes
# (224 px and below) it decodes about as fast as AV1 on a CPU.
FALLBACK_CODEC = "h264"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from ``512MB``, ``1GB``, ``256MiB`` or a plain integer (decimal units are powers of 1024 too,
    as people mean them for shard sizes)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size (examples: 512MB, 1GB, 268435456)")
    value, unit = float(m.group(1)), m.group(2).lower()
    size = int(value * 1024 ** " kmgt".index(unit or " "))
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


@dataclass(frozen=True)
class ConvertOptions:
    """Options that decide the output bytes; ``convert.json`` and the manifest record them.

    The shard target is a byte size or an episode count (``shard_plan.shard_target``): with
    neither given, ``shard_bytes`` becomes the default size, so the record names it.
    """

    shard_bytes: int | None = None
    episodes_per_shard: int | None = None
    shuffle_seed: int | None = None
    reencode: str | None = None  # None: stream copy, re-encoding only episodes off a keyframe
    gop: int = DEFAULT_GOP
    crf: int | None = None  # None: DEFAULT_CRF of the codec
    # Stored frame size per camera: (camera or "*" for all, height, width), sorted; given as
    # that or as ``{camera or "*": (height, width)}`` (``resize.parse_resize``). Resized cameras
    # are always re-encoded (in ``codec``); the others follow ``reencode``.
    resize: tuple[tuple[str, int, int], ...] | Mapping[str, Sequence[int]] = ()
    resize_mode: str = DEFAULT_MODE

    def __post_init__(self) -> None:
        shard_bytes, _ = shard_target(self.shard_bytes, self.episodes_per_shard)
        object.__setattr__(self, "shard_bytes", shard_bytes)
        if self.reencode is not None and self.reencode not in CODECS:
            raise ValueError(f"reencode must be one of {', '.join(CODECS)}, got {self.reencode!r}")
        if self.shuffle_seed is not None and self.shuffle_seed < 0:  # numpy's seeds are non-negative
            raise ValueError(
                f"shuffle_seed (--shuffle-episodes) must be a non-negative integer, got {self.shuffle_seed}"
            )
        if self.gop < 1:
            raise ValueError(f"gop must be at least 1, got {self.gop}")
        check_mode(self.resize_mode)
        entries = list(self.resize.items() if isinstance(self.resize, Mapping) else ((c, s) for c, *s in self.resize))
        for camera, size in entries:  # before any int(): 2.5 must be refused, not truncated
            check_size(tuple(size), str(camera))
        resize = tuple(sorted((str(c), int(size[0]), int(size[1])) for c, size in entries))
        if len({c for c, _, _ in resize}) != len(resize):
            raise ValueError(f"resize names a camera twice: {resize}")
        object.__setattr__(self, "resize", resize)

    @property
    def _resize(self) -> tuple[tuple[str, int, int], ...]:
        """``resize`` as ``__post_init__`` normalised it (the field also accepts a mapping)."""
        return cast("tuple[tuple[str, int, int], ...]", self.resize)

    def camera_sizes(self, cameras: Iterable[str], depth: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
        """Stored (height, width) of each resized camera; raises ValueError naming unknown cameras or a
        depth camera (``depth``: never resized, ``resize.camera_sizes``)."""
        return camera_sizes({c: (h, w) for c, h, w in self._resize}, cameras, depth)

    def size_of(self, camera: str) -> tuple[int, int] | None:
        """Stored (height, width) of ``camera``, None when it keeps the source's size."""
        sizes = {c: (h, w) for c, h, w in self._resize}
        return sizes.get(camera, sizes.get("*"))

    @property
    def codec(self) -> str:
        """Codec of every re-encoded clip: the ``reencode`` one, else the fallback."""
        return self.reencode or FALLBACK_CODEC

    @property
    def effective_crf(self) -> int:
        """CRF of re-encoded clips: the one given, else the codec's default."""
        return self.crf if self.crf is not None else DEFAULT_CRF[self.codec]

    def video_settings(self) -> dict[str, Any]:
        """The manifest's ``video`` entry: how clips were produced."""
        settings: dict[str, Any] = {
            "mode": "reencode" if self.reencode else "copy",
            "codec": self.codec,
            "gop": self.gop,
            "crf": self.effective_crf,
            "bframes": 0,
        }
        if self.resize:
            settings["resize"] = {c: [h, w] for c, h, w in self._resize}
            settings["resize_mode"] = self.resize_mode
        return settings

    def to_dict(self) -> dict[str, Any]:
        """Every option, for ``convert.json`` and the manifest's converter record; JSON-ready, and
        without --resize exactly what earlier versions recorded, so their runs resume."""
        d = asdict(self)
        if self.resize:
            d["resize"] = {c: [h, w] for c, h, w in self._resize}
        else:
            del d["resize"], d["resize_mode"]
        return d


@dataclass(frozen=True)
class RunOptions:
    """How a conversion is run; unlike ``ConvertOptions`` they never change the bytes written.

    The one object the run hands to its worker processes and the shard writer.
    """

    workers: int = 1  # processes building shards (spawned; 1: in this process)
    num_tasks: int = 1  # tasks of an array job; task i converts shards s with s % num_tasks == i
    task_index: int = 0
    finalize_only: bool = False  # convert nothing: write the manifest, or fail naming missing shards
    # A bad episode is left out and recorded in its sidecar's ``skipped``, instead of failing the run.
    skip_bad_episodes: bool = False
    # Decode every packet of stream-copied clips with strict error detection (boundary frames
    # are always decoded; ``shard_writer._clip``).
    check_decode: bool = False
    overwrite: bool = False  # replace a destination holding another run's output (ours only)
    progress: bool = True  # the episodes bar on stderr

    def __post_init__(self) -> None:
        for name in ("workers", "num_tasks", "task_index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "task_index" else 1):
                low = 0 if name == "task_index" else 1
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.task_index >= self.num_tasks:
            raise ValueError(f"task_index must be in 0..{self.num_tasks - 1}, got {self.task_index}")
        for name in ("finalize_only", "skip_bad_episodes", "check_decode", "overwrite", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


DEFAULT_RUN = RunOptions()


def make_plan(source: LeRobotV3Source, options: ConvertOptions) -> list[PlannedShard]:
    """The conversion's shard plan: the source's episodes grouped by the options' shard target."""
    return plan_shards(
        source.episode_sizes(),
        target_bytes=options.shard_bytes,
        episodes_per_shard=options.episodes_per_shard,
        shuffle_seed=options.shuffle_seed,
    )


def plan_digest(plan: list[PlannedShard]) -> str:
    """Fingerprint of a plan: a re-run with a changed source or options gets a different one."""
    text = json.dumps([[s.index, list(s.episodes), s.frames] for s in plan], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def task_share(plan: list[PlannedShard], num_tasks: int, task_index: int) -> list[PlannedShard]:
    """Task ``task_index`` of ``num_tasks`` converts shards ``i`` with ``i % num_tasks == task_index``.

    Striding (rather than contiguous ranges) spreads large and small shards of a
    source-ordered dataset over all tasks, so array jobs finish at about the same time.
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
    if not 0 <= task_index < num_tasks:
        raise ValueError(f"task_index must be in 0..{num_tasks - 1}, got {task_index}")
    return [s for s in plan if s.index % num_tasks == task_index]
