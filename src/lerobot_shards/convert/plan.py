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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..format import CODECS
from ..shard_plan import PlannedShard, plan_shards, shard_target

if TYPE_CHECKING:
    from ..lerobot_v3 import LeRobotV3Source

# g=2 as LeRobot itself encodes: a random frame costs ~1.5 decoded frames, which is what
# training with random (episode, frame, delta) access needs; sequential readers lose little.
DEFAULT_GOP = 2
# Visually lossless-ish defaults per codec (libx264/libx265 CRF scales differ from SVT-AV1's).
DEFAULT_CRF = {"h264": 18, "hevc": 20, "av1": 30}
FALLBACK_CODEC = "h264"  # stream-copy mode re-encodes off-keyframe episodes with this

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

    def __post_init__(self) -> None:
        shard_bytes, _ = shard_target(self.shard_bytes, self.episodes_per_shard)
        object.__setattr__(self, "shard_bytes", shard_bytes)
        if self.reencode is not None and self.reencode not in CODECS:
            raise ValueError(f"reencode must be one of {', '.join(CODECS)}, got {self.reencode!r}")
        if self.gop < 1:
            raise ValueError(f"gop must be at least 1, got {self.gop}")

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
        return {
            "mode": "reencode" if self.reencode else "copy",
            "codec": self.codec,
            "gop": self.gop,
            "crf": self.effective_crf,
            "bframes": 0,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every option, for ``convert.json`` and the manifest's converter record."""
        return asdict(self)


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
