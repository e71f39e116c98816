"""What ``lerobot-shards train`` decides about the decoded-frame cache and the partition, and why.

A policy trains for tens to hundreds of epochs over the same frames; with the cache each frame is
decoded once, in order, and read back from the node's disk (and page cache) after that. So the
command turns it on by itself when the node's local disk has room for the frames it will decode
(``--shards.frame_cache=auto``, the default), in ``$TMPDIR`` (the node-local scratch most
clusters point it to) or the directory given (``--shards.frame_cache=DIR``), and leaves it off
with ``--shards.frame_cache=off``. "Room" means the frames, with headroom, fit in ``DISK_SHARE``
of the filesystem's free space plus what the cache already holds there (a re-run reuses it).

The partition is node-sticky by default (``--shards.partition=auto``; ``partition="node"``):
each node reads the same part of the dataset every epoch, so from the second epoch on every frame
is a hit in the node's frame cache (and every shard in its shard cache, ``--shards.cache_dir``),
and each node needs room for its own part only. Under the global partition a node reads another
part every epoch and hits only once it has cached the whole dataset. The global batch still
mixes every node's part (each step's batch holds every node's share: a stratified draw, not a
narrower one). What it costs: a resume must run on as many nodes (any ranks per node and
workers), so a run that must resume on another node count sets ``--shards.partition=global``.
On one node both partitions are the same order. A mixture is global (``MixtureDataset`` has no
node partition yet), and a resumed checkpoint keeps the partition its order was saved with.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..loader.read.shard_cache import CacheDirError, check_owned

AUTO, OFF = "auto", "off"
DISK_SHARE = 0.8  # of the free space (plus the cache's own bytes): leave the node's disk room to work
HEADROOM = 1.1  # entries' headers and checksum tables, a node's part above the mean
DEFAULT_NAME = "lerobot-shards-frames"


def default_directory() -> str:
    """``$TMPDIR/lerobot-shards-frames-<uid>`` (``/tmp`` without ``TMPDIR``): node-local on most
    machines, and the user's own (another user's run on the node has its own; the cache refuses a
    directory another user made: ``frame_cache.check_owned``)."""
    return os.path.join(tempfile.gettempdir(), f"{DEFAULT_NAME}-{os.geteuid()}")


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def free_bytes(directory: str) -> int:
    """Free bytes (for an unprivileged user) of the filesystem ``directory`` is or would be on."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def held_bytes(directory: str) -> int:
    """Bytes of the files under ``directory`` (a cache's own, reusable by this run); 0 if absent."""
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:  # removed meanwhile (evicted by another run)
                pass
    return total


@dataclass(frozen=True)
class FrameCacheChoice:
    """The cache's directory and bound (``None``: off) and why, as the command prints them."""

    directory: str | None
    max_bytes: int | None
    why: str

    def line(self) -> str:
        what = f"on in {self.directory}, at most {gib(self.max_bytes or 0)}" if self.directory else "off"
        return f"lerobot-shards train: decoded-frame cache {what} ({self.why}; --shards.frame_cache=off|auto|DIR)"


def choose_frame_cache(setting: str, needed: int) -> FrameCacheChoice:
    """The cache for ``needed`` bytes of decoded frames (this node's share) under ``setting``:
    ``off``, ``auto`` (on in ``default_directory()`` when they fit) or a directory (on there,
    bounded by the room it has: least recently used entries are then evicted)."""
    if setting == OFF:
        return FrameCacheChoice(None, None, "turned off")
    directory = default_directory() if setting == AUTO else setting
    if setting == AUTO:
        try:
            check_owned(directory, "frame_cache_dir")
        except CacheDirError as e:  # auto never stops a run: off, saying why
            return FrameCacheChoice(None, None, str(e))
    want = int(needed * HEADROOM) + (64 << 20)
    room = int((free_bytes(directory) + held_bytes(directory)) * DISK_SHARE)
    fits = f"the decoded frames need {gib(want)}, {gib(room)} of room there"
    if setting != AUTO:
        return FrameCacheChoice(directory, max(1, min(want, room)), f"given; {fits}")
    if want <= room:
        return FrameCacheChoice(directory, want, f"{fits}: each frame decoded once, read back every later epoch")
    return FrameCacheChoice(
        None,
        None,
        f"{fits} in {directory}: frames are decoded at every read; give --shards.frame_cache=DIR on a larger "
        "local disk to cache what fits",
    )


def choose_partition(setting: str, mixture: bool, state: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(partition, why)``: as given, else a resumed checkpoint's (its node count is part of its
    order), else global for a mixture, else node-sticky (see the module docstring)."""
    if setting != AUTO:
        return setting, "given"
    if state is not None:
        return ("node" if state.get("nodes", 1) > 1 else "global"), "the checkpoint's"
    if mixture:
        return "global", "a mixture has no node partition yet"
    return "node", "each node's caches hit from the second epoch"
