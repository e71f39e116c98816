"""The benchmark matrix: what a case is, the sample windows (modes), and how the matrix expands.

A case is one loader configuration run in its own process. ``kind`` says which loader:
``ours`` (EpisodePoolDataset), a LeRobot baseline (``<name>:map`` or ``<name>:streaming`` where
``<name>`` names an interpreter command), ``pure-decode`` (torchcodec alone, the decode limit per
core) or ``ceiling`` (same-shape samples with no I/O through the same DataLoader).

A case of ours with an ``epoch`` (``cold``, ``warm`` or ``disk``) reads through the decoded-frame
cache (``frame_cache_dir``) and is measured over a whole epoch, from ``iter()`` to its last batch:
``cold`` the first epoch into an empty cache (each frame decoded once, in order), ``warm`` the
next epoch, every frame read back from the cache the cold epoch filled, ``disk`` that epoch again
once the entries' pages are dropped from the page cache (``measure.drop_page_cache``), every frame
read from the disk: what a warm epoch runs at when the decoded frames do not fit in memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

SOURCES = ("raw-local", "converted-local", "raw-bucket", "converted-bucket", "converted-bucket-warm")
# Sources of the frame cache's epochs: the conversion, and a training-size one (``--resized-conversion``).
FRAME_CACHE_SOURCES = ("converted-local", "converted-resized")
EPOCHS = ("cold", "warm", "disk")
MODES = ("frame", "act", "long")
DECODES = ("cpu", "cuda")
TRANSPORTS = ("queue", "slab")  # worker -> main: the DataLoader's default collate, or loader.transport
STATE, ACTION = "observation.state", "action"
ACT_CHUNK = 50  # ACT / pi0-like action chunk
LONG_STEPS, LONG_FRAMES = 160, 8  # reward-model window: 160 steps of state/action, 8 frames over it


def camera_offsets(mode: str) -> list[int]:
    """Frame offsets of each camera's window, in frames."""
    if mode == "frame":
        return [0]
    if mode == "act":
        return [-1, 0]
    if mode == "long":
        step = (LONG_STEPS - 1) / (LONG_FRAMES - 1)
        return sorted({round(-(LONG_STEPS - 1) + k * step) for k in range(LONG_FRAMES)})
    raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")


def delta_timestamps(mode: str, fps: float, cameras: list[str]) -> dict[str, list[float]] | None:
    """LeRobot ``delta_timestamps`` of a mode (seconds on the frame grid); None for ``frame``."""
    if mode == "frame":
        return None
    out = {cam: [o / fps for o in camera_offsets(mode)] for cam in cameras}
    if mode == "act":  # 2 frames per camera, the current state, 50 future actions
        out[ACTION] = [i / fps for i in range(ACT_CHUNK)]
    else:  # the past 160 steps of state and action
        steps = [(i - LONG_STEPS + 1) / fps for i in range(LONG_STEPS)]
        out[STATE], out[ACTION] = steps, steps
    return out


@dataclass
class Case:
    kind: str  # ours | pure-decode | ceiling | <baseline>:map | <baseline>:streaming
    source: str
    mode: str
    decode: str = "cpu"
    workers: int = 2
    batch_size: int = 16
    pool_size: int = 8
    prefetch_factor: int = 4  # LeRobot's training runs use 4
    image_dtype: str = "uint8"
    resize: list[int] | None = None
    label: str = ""  # names a variant (e.g. loader options under test); part of the case name
    transport: str = "queue"  # with workers: "queue" (the DataLoader's default collate) or "slab" (SlabCollate)
    loader_opts: dict[str, Any] = field(default_factory=dict)  # passed to EpisodePoolDataset as is
    epoch: str = ""  # "cold", "warm" or "disk": a whole epoch through the frame cache (the module docstring)

    @property
    def name(self) -> str:
        parts = [self.kind.replace(":", "-"), self.source, self.mode, self.decode, f"w{self.workers}", self.image_dtype]
        if self.label:
            parts.append(self.label)
        if self.epoch:
            parts.append(self.epoch)
        if self.transport != "queue":
            parts.append(self.transport)
        if self.loader_opts:  # distinct options never overwrite each other's results
            parts.append(hashlib.sha1(json.dumps(self.loader_opts, sort_keys=True).encode()).hexdigest()[:6])
        return "__".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expand(
    *,
    sources: list[str],
    modes: list[str],
    decodes: list[str],
    workers: list[int],
    image_dtypes: list[str],
    baselines: list[str],
    baseline_datasets: list[str],
    limits: bool,
    transports: tuple[str, ...] = ("queue",),
    frame_cache_sources: tuple[str, ...] = (),
    baseline_workers: list[int] | None = None,
    **common: Any,
) -> list[Case]:
    """Every case of the matrix, ours first, then baselines and limits (raw-local, cpu), per mode.

    Ours runs once per transport (``TRANSPORTS``); without workers nothing crosses a process
    boundary, and "slab" is ``slab_loader``'s own ring in the main process (reused batches that the
    decode threads read frames into). The DataLoader ceiling runs once per transport with workers.

    LeRobot's baselines run only at worker counts above 0: its loaders are always measured with
    DataLoader workers, and ours at workers=0 (decode threads in the main process) is compared
    with LeRobot's best worker count instead (``report.targets``).

    Each of ``frame_cache_sources`` adds ours' cold epoch, then its warm one (which reads the
    cache the cold one filled), then the same from the disk, per worker count, transport and dtype. ``baseline_workers``
    (default ``workers``): the worker counts LeRobot's baselines run at, to find its best one.
    """
    ways = lambda w: transports if w else ("queue",)  # noqa: E731
    cases = [
        Case("ours", s, m, d, w, image_dtype=t, transport=x, **common)
        for m in modes
        for s in sources
        for d in decodes
        for w in workers
        for x in transports
        for t in image_dtypes
    ]
    cases += [
        Case("ours", s, m, "cpu", w, image_dtype=t, transport=x, epoch=e, **common)
        for m in modes
        for s in frame_cache_sources
        for w in workers
        for x in transports
        for t in image_dtypes
        for e in EPOCHS
    ]
    for m in modes:
        for w in sorted(set(workers) | set(baseline_workers or ())):
            for b in baselines if w and w in (baseline_workers or workers) else ():
                cases += [
                    Case(f"{b}:{kind}", "raw-local", m, "cpu", w, image_dtype=t, **common)
                    for kind in baseline_datasets
                    for t in image_dtypes
                ]
            if limits and w in workers:
                cases.append(Case("pure-decode", "converted-local", m, "cpu", w, image_dtype="uint8", **common))
                cases += [
                    Case("ceiling", "converted-local", m, "cpu", w, image_dtype=t, transport=x, **common)
                    for x in ways(w)
                    for t in image_dtypes
                ]
    return cases
