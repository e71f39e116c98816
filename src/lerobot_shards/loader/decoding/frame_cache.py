"""A node-wide cache of decoded frames: each frame of a training run decoded once, then read back.

Random access costs 2.2-2.6 decoded frames per frame asked for, and every epoch asks again; a
sequential pass decodes each frame once. So when an episode is admitted, its frames are decoded
in order into an entry here (``frame_fill``), and samples read their windows from the entry.

An entry is one clip at one decoded size: every frame of one episode's camera, uint8, exactly as
the loader returns it (after ``resize``), one frame after the other, so a window is one read.
Frames lie in the memory order their consumer wants (``FrameCache(planar=...)``, part of the key):

- (H, W, C), the order torchcodec decodes into and the loader hands out ((C, H, W)-shaped views
  over channels-last memory, ``torch.channels_last``): a fill writes the decoder's frames as they are,
  and a read lands in a channels-last batch slot as one plain copy. A planar entry costs a
  transposing copy of every frame at fill (0.55 ms per 480p frame on the 2-core machine);
- (C, H, W), planar, for frames that are augmented next (``image_transforms``): LeRobot's
  transforms cost less on contiguous frames than that copy once per run (ACT under LeRobot's
  trainer, transforms on: 0.049 against 0.053 CPU s per sample; without transforms the same).

Where it can (``FrameCache(pixels="yuv420p")``, the default), an (H, W, C) entry keeps the
decoder's own YUV 4:2:0 planes instead (``planes``), half the bytes of RGB, and each read converts
them into the caller's tensor as torchcodec converts (``swscale``, bit for bit): a cold epoch
writes half the bytes into new page-cache pages, and a warm epoch needs half the page cache, for
~0.1 ms per 480p frame read. The header says which (``pixels``); the key does not, since both give
the same frames: an entry either way serves every consumer.

Its
name is a hash of what decides its bytes (``entry_key``): the clip's content (the xxh3-128 of a
converted clip's bytes, which is its member checksum; a raw mp4's URL, inode, size, modification
and change times), the episode's first frame and length in it, the frame tables, the decoded size and resize
mode, and the versions of torchcodec, its FFmpeg and this package (which decode and resize). A changed
source or another resize is another entry, never a stale one.

The rules of the shard cache (``loader.read.shard_cache``) hold here too, with its helpers: the directory is
shared by every rank and worker on the node through ``flock`` alone; an entry is written under a
temporary name and renamed when complete (a fill killed with -9 leaves a temporary file that is
never served and is swept by the next fill of the entry, or evicted); space is reserved at full
size under the global lock, so the sum of entries never exceeds ``max_bytes``; unused entries
are evicted least recently used, only the cache's own files (listed in ``.locks/``), never an
entry in use (its users hold a shared lock on it). One consumer fills an entry at a time (its
lock in ``.locks/``, taken without waiting: another consumer that needs the entry meanwhile
decodes its samples as without the cache, and reads the entry once it is complete).

Verified on read: each frame's xxh3-128 (of its bytes as kept: RGB, or YUV planes before their
conversion) is recorded in the entry's header block and checked on
every read (~50 us per 480p frame); the header names the entry's full key, its frame count must be
the key's, and its own xxh3-128 follows it (a flipped bit in its shape would otherwise pass every
frame's checksum and return the frame's bytes in another shape). A frame whose
bytes do not match (truncated, changed on disk, a disk error) is never returned: the entry is
deleted and the frames are decoded again.

Frames are read with ``preadv`` into a tensor of the caller's (a batch's slab slot, or a fresh
window): the bytes live in the kernel's page cache, shared by every process on the node, not in a
consumer's own memory, which does not grow with the cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import glob
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import xxhash

from ... import __version__
from ...exceptions import LeRobotShardsError
from ...format import TMP_SUFFIX
from ...torch_pair import decoder_versions
from ..options import DecodeOptions
from ..read.shard_cache import (
    GLOBAL_LOCK,
    LOCKS_DIR,
    _check_ours,
    _evict,
    _lock_name,
    _locked,
    check_cache_dir,
    check_owned,
    default_cache_bytes,
    plan_evictions,
    scan,
)
from ..read.sources import ClipRef
from . import swscale

log = logging.getLogger(__name__)

MAGIC = b"LRSFRAMES3\n"
ALIGN = 4096  # header and checksum table end on a page: frames start page-aligned
DIGEST_BYTES = 16  # xxh3-128
ENTRIES_DIR = "frames"
# 2: the header's JSON is followed by its xxh3-128 (a flipped bit in it is caught); 3: "order";
# 4: "pixels" (frames kept as YUV 4:2:0, converted at each read)
FORMAT = 4
Pixels = Literal["rgb", "yuv420p"]
# In ``LOCKS_DIR`` (never counted, never evicted): an upper bound of the entries' sum, kept under
# the global lock, so that a reservation with room reads 8 bytes instead of walking the directory.
LEDGER = "frames.bytes"
# An eviction frees this share of the bound beyond what it needs (when it can), so that the
# directory is walked once per many reservations at capacity, not at each: O(1) amortized.
HEADROOM = 0.05


class FrameCacheError(LeRobotShardsError, OSError):
    """An entry's bytes are not what its header recorded (truncated, changed on disk)."""


def entry_key(clip: ClipRef, length: int, size: tuple[int, int] | None, mode: str, planar: bool = False) -> str | None:
    """What decides the decoded bytes of ``length`` frames of ``clip`` at ``size`` (``planar``: in
    (C, H, W) order, else (H, W, C)), as one string;
    None when the clip's content cannot be named cheaply (a raw mp4 read straight from storage:
    its frames are then decoded at emit, as without the cache), and for a depth camera's clip (float32
    depth dequantized by PyAV's decode, not the uint8 frames an entry holds: decoded at emit)."""
    if clip.depth is not None:
        return None
    if clip.data is not None:
        content = "xxh3:" + xxhash.xxh3_128_hexdigest(clip.data)
    elif clip.url is not None and "://" not in clip.url:
        try:
            st = os.stat(clip.url)
        except OSError:
            return None
        # the change time too: nobody sets it (touch -d and utime set it to now), so an mp4 rewritten
        # in place, its size and modification time restored, is another entry, never the old frames
        content = f"file:{clip.cache_key}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    else:
        return None
    mappings = None if clip.frame_mappings is None else xxhash.xxh3_128_hexdigest(clip.frame_mappings.encode())
    return json.dumps(
        {
            "format": FORMAT,
            "content": content,
            "first_frame": clip.first_frame,
            "frames": length,
            "frame_mappings": mappings,
            "size": None if size is None else list(size),
            "resize_mode": None if size is None else mode,
            "order": "chw" if planar else "hwc",
            "decoder": _decoder_versions(),
            "lerobot_shards": __version__,
        },
        sort_keys=True,
    )


_decoder_versions = functools.cache(decoder_versions)


def _rel(key: str) -> str:
    return f"{ENTRIES_DIR}/{hashlib.sha256(key.encode()).hexdigest()[:40]}.frames"


@dataclass(frozen=True)
class Layout:
    """Where an entry's parts lie: header (magic, JSON), checksum table, frames."""

    frames: int
    shape: tuple[int, int, int]  # (C, H, W) of the frames read
    planar: bool = False  # frames stored (C, H, W); else (H, W, C)
    pixels: Pixels = "rgb"  # "yuv420p": stored as the decoder's planes, read as (H, W, C) RGB
    colorspace: int = 0  # a YUV entry's AVColorSpace (its conversion's coefficients)

    @property
    def frame_bytes(self) -> int:
        c, h, w = self.shape
        return swscale.frame_bytes(h, w) if self.pixels == "yuv420p" else c * h * w

    @property
    def table(self) -> int:
        return ALIGN  # the header block is one page

    @property
    def data(self) -> int:
        return self.table + _aligned(self.frames * DIGEST_BYTES)

    @property
    def size(self) -> int:
        return self.data + self.frames * self.frame_bytes


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _header(key: str, layout: Layout) -> bytes:
    body = json.dumps(
        {
            "key": key,
            "frames": layout.frames,
            "shape": list(layout.shape),
            "order": "chw" if layout.planar else "hwc",
            "pixels": layout.pixels,
            "colorspace": layout.colorspace,
        }
    ).encode()
    block = MAGIC + len(body).to_bytes(4, "little") + body + xxhash.xxh3_128_digest(body)
    if len(block) > ALIGN:
        raise ValueError(f"frame cache key too long ({len(block)} bytes)")
    return block.ljust(ALIGN, b"\0")


def _parse_header(block: bytes, where: str) -> tuple[str, Layout]:
    if not block.startswith(MAGIC):
        raise FrameCacheError(errno.EINVAL, f"{where}: not a frame cache entry (bad magic)")
    n = int.from_bytes(block[len(MAGIC) : len(MAGIC) + 4], "little")
    body = block[len(MAGIC) + 4 : len(MAGIC) + 4 + n]
    if len(body) != n or block[len(MAGIC) + 4 + n : len(MAGIC) + 4 + n + DIGEST_BYTES] != xxhash.xxh3_128_digest(body):
        raise FrameCacheError(errno.EINVAL, f"{where}: header fails its checksum")
    try:
        head = json.loads(body)
        if head["order"] not in ("chw", "hwc"):
            raise ValueError(f"order {head['order']!r}")
        if head["pixels"] not in ("rgb", "yuv420p"):
            raise ValueError(f"pixels {head['pixels']!r}")
        shape = tuple(int(x) for x in head["shape"])
        layout = Layout(
            int(head["frames"]),
            shape,  # type: ignore[arg-type]
            head["order"] == "chw",
            head["pixels"],
            int(head["colorspace"]),
        )
        key = str(head["key"])
    except (ValueError, KeyError, TypeError) as e:
        raise FrameCacheError(errno.EINVAL, f"{where}: unreadable header ({e})") from None
    if layout.frames < 1 or len(layout.shape) != 3 or min(layout.shape) < 1:
        raise FrameCacheError(errno.EINVAL, f"{where}: header has {layout.frames} frames of shape {layout.shape}")
    if layout.pixels == "yuv420p" and (
        layout.planar
        or layout.shape[0] != 3
        or not swscale.convertible(layout.shape[1], layout.shape[2])
        or not 0 <= layout.colorspace <= swscale.MAX_COLORSPACE
    ):
        raise FrameCacheError(errno.EINVAL, f"{where}: header has YUV frames of shape {layout.shape} it cannot convert")
    return key, layout


class _Frames:
    """Frames at known offsets of an open file, each checked against its recorded xxh3-128."""

    def __init__(self, fd: int, path: str, layout: Layout, digests: list[bytes]) -> None:
        self.fd = fd
        self.path = path
        self.layout = layout
        self.digests = digests

    def read(self, indices: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """Frames ``indices`` as uint8 (N, C, H, W) in the entry's memory order (channels-last, or
        contiguous when planar), into ``out`` when given (such a tensor, that shape): consecutive
        frames are one ``preadv``, every frame is verified."""
        n = len(indices)
        planar = self.layout.planar
        order = torch.contiguous_format if planar else torch.channels_last
        if out is None or out.dtype != torch.uint8 or out.shape != (n, *self.layout.shape):
            out = None
        if out is None or not out.is_contiguous(memory_format=order):
            c, h, w = self.layout.shape
            out = torch.empty((n, c, h, w) if planar else (n, h, w, c), dtype=torch.uint8)
            out = out if planar else out.permute(0, 3, 1, 2)
        flat = (out if planar else out.permute(0, 2, 3, 1)).numpy().reshape(n, -1)
        fb = self.layout.frame_bytes
        yuv = self.layout.pixels == "yuv420p"
        i = 0
        while i < n:
            j = i + 1
            while j < n and indices[j] == indices[j - 1] + 1:
                j += 1
            first = int(indices[i])
            if not 0 <= first or int(indices[j - 1]) >= self.layout.frames:
                raise IndexError(f"{self.path}: frames {indices} outside the entry's {self.layout.frames}")
            stored = swscale.scratch((j - i) * fb).reshape(j - i, fb) if yuv else flat[i:j]
            view = stored.data.cast("B")
            got = os.preadv(self.fd, [view], self.layout.data + first * fb)
            if got != len(view):
                raise FrameCacheError(errno.EIO, f"{self.path}: truncated (frame {first + got // fb} missing)")
            for k in range(i, j):
                if xxhash.xxh3_128_digest(stored[k - i]) != self.digests[int(indices[k])]:
                    raise FrameCacheError(errno.EIO, f"{self.path}: frame {int(indices[k])} fails its checksum")
                if yuv:  # verified, then converted into its place as torchcodec converts
                    _, h, w = self.layout.shape
                    swscale.to_rgb(stored[k - i], flat[k], h, w, self.layout.colorspace)
            i = j
        return out


class Entry(_Frames):
    """A complete entry held in use (its shared lock) until ``close``."""

    def close(self) -> None:
        os.close(self.fd)


class Fill(_Frames):
    """An entry being written, frame by frame in order, under the entry's fill lock; frames
    written so far (``progress``) can be read back (verified against the digests kept here)."""

    def __init__(self, cache: FrameCache, key: str, final: str, lock: int) -> None:
        super().__init__(-1, final, Layout(0, (1, 1, 1)), [])
        self.cache = cache
        self.key = key
        self.final = final
        self.lock = lock
        self.tmp: str | None = None
        self.progress = 0
        self._staged: torch.Tensor | None = None  # one frame in the entry's order on its way to the file
        # CPU seconds of this thread in the writes into the page cache (``write``): what a new page
        # costs, reported apart because a VM whose host backs guest memory lazily multiplies it
        self.write_seconds = 0.0

    def reserve(
        self, frames: int, shape: tuple[int, int, int], pixels: Pixels = "rgb", colorspace: int = 0
    ) -> int | None:
        """Make room for the whole entry (``frames`` of ``shape`` (C, H, W) as read, kept as
        ``pixels``) and create its temporary file at full size: the number of entries evicted for
        it, or None when it does not fit beside the entries in use."""
        self.layout = Layout(frames, shape, self.cache.planar, pixels, colorspace)
        self.digests = [b""] * frames
        tmp = f"{self.final}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
        root, need, bound = self.cache.root, self.layout.size, self.cache.max_bytes
        with _locked(os.path.join(root, GLOBAL_LOCK)):
            ledger = os.path.join(root, LOCKS_DIR, LEDGER)
            known, plan = _read_ledger(ledger), []
            if known is None or known + need > bound:  # the truth, from the directory
                # which entries are in use (a lock probe each) is asked only when some must be evicted
                entries = scan(root, probe=False)
                known = sum(e.size for e in entries)
                if known + need > bound:
                    entries = scan(root)
                    found = plan_evictions(entries, need + int(HEADROOM * bound), bound)
                    found = found if found is not None else plan_evictions(entries, need, bound)
                    if found is None:
                        return None
                    plan = found
                    sizes = {e.path: e.size for e in entries}
                    for path in plan:
                        if not _evict(path):  # taken into use since the scan (the ledger stays high)
                            return None
                        known -= sizes[path]
            # written before the file is made: a fill killed or failed from here leaves the ledger
            # high, never low (entries deleted elsewhere too), and a ledger found too high for the
            # next reservation makes it walk the directory, which sets it right
            _write_ledger(ledger, known + need)
            os.makedirs(os.path.dirname(self.final), exist_ok=True)
            _check_ours(self.cache.root, self.final, self.final)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            self.fd, self.tmp = fd, tmp
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use: never evicted while written
            os.posix_fallocate(fd, 0, self.layout.size)  # a full disk says so now (ENOSPC), not mid-fill
        return len(plan)

    def write(self, frames: torch.Tensor) -> None:
        """Append decoded frames (uint8 (N, C, H, W) of the reserved shape), one frame at a time.

        Frames already in the entry's memory order (a decoder's are channels-last) are written as
        they lie and each hashed right after, while the write has left it in the core's cache.
        Others (resized ones are contiguous; any for a planar entry) are first copied, frame by
        frame, into one reused buffer (0.92 MB at 480p: it stays in the core's cache)."""
        if tuple(frames.shape[1:]) != self.layout.shape or frames.dtype != torch.uint8:
            raise ValueError(
                f"{self.final}: frames {tuple(frames.shape)} {frames.dtype} for an entry of {self.layout.shape}"
            )
        for frame in (frames if self.layout.planar else frames.permute(0, 2, 3, 1)).numpy():
            if not frame.flags.c_contiguous:
                if self._staged is None:
                    self._staged = torch.empty(frame.shape, dtype=torch.uint8)
                np.copyto(self._staged.numpy(), frame)  # numpy's strided copy: cheaper than torch's
                frame = self._staged.numpy()
            self.write_stored(frame.reshape(-1))

    def write_stored(self, frame: np.ndarray) -> None:
        """Append one frame's stored bytes (``frame_bytes``, contiguous: RGB in the entry's order, or
        a YUV entry's planes), hashed right after the write has left them in the core's cache."""
        assert self.progress < self.layout.frames and frame.nbytes == self.layout.frame_bytes
        whole = frame.data.cast("B")
        view = whole
        offset = self.layout.data + self.progress * self.layout.frame_bytes
        cpu = time.thread_time()
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written
        self.write_seconds += time.thread_time() - cpu
        self.digests[self.progress] = xxhash.xxh3_128_digest(whole)
        self.progress += 1

    def commit(self) -> Entry:
        """Write the header and checksum table, then give the entry its final name (under the
        global lock: a reservation's scan never misses it mid-rename). The entry stays in use."""
        assert self.tmp is not None and self.progress == self.layout.frames
        self._staged = None
        os.pwrite(self.fd, b"".join(self.digests), self.layout.table)
        os.pwrite(self.fd, _header(self.key, self.layout), 0)
        with _locked(os.path.join(self.cache.root, GLOBAL_LOCK)):
            os.replace(self.tmp, self.final)
        os.close(self.lock)
        self.lock = -1
        return Entry(self.fd, self.final, self.layout, self.digests)

    def abort(self) -> None:
        """Give up: the temporary file is deleted, the fill lock released."""
        self._staged = None
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            os.close(self.fd)
            self.tmp = None
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1


def _read_ledger(path: str) -> int | None:
    """The ledger's bound of the entries' sum; None (walk the directory) when it is missing, not a
    regular file (a FIFO put there would block every reservation, under the global lock, forever),
    or not a number >= 0 (a torn write, an edit)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(fd, 32) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    try:
        total = int(text)
    except ValueError:
        return None
    return total if total >= 0 else None


def _write_ledger(path: str, total: int) -> None:
    """Replace the ledger whole (whatever stood there: a FIFO or symlink is replaced, never opened)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, str(max(0, total)).encode())
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class FrameCache:
    """The frame cache directory as one consumer uses it (shared by its decode threads)."""

    def __init__(self, root: str, max_bytes: int, planar: bool = False, pixels: Pixels = "yuv420p") -> None:
        check_cache_dir(root, what="frame_cache_dir")
        self.root = root
        self.max_bytes = int(max_bytes)
        self.planar = planar  # entries written (C, H, W) (frames augmented next), else (H, W, C)
        # "yuv420p": fills keep the decoder's planes where their RGB can be made as torchcodec makes
        # it (``planes``, ``swscale``; not planar entries), else RGB; "rgb": RGB always
        self.pixels: Pixels = "rgb" if planar else pixels
        self.fills_off = False  # the disk is full: read what is there, write nothing more

    def _path(self, key: str) -> tuple[str, str]:
        rel = _rel(key)
        return rel, os.path.join(self.root, *rel.split("/"))

    def open(self, key: str) -> Entry | None:
        """The complete entry for ``key``, held in use, or None (absent, or not a valid entry: such
        a file is deleted, unless another consumer holds it)."""
        _, path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file stands where frames/ goes
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or os.stat(path).st_ino != st.st_ino:  # evicted meanwhile
                os.close(fd)
                return None
            got_key, layout = _parse_header(os.pread(fd, ALIGN, 0), path)
            head = json.loads(key)
            wrong = layout.frames != head["frames"] or layout.planar != (head["order"] == "chw")
            if got_key != key or st.st_size != layout.size or wrong:
                raise FrameCacheError(
                    errno.EINVAL,
                    f"{path}: holds another entry, or {layout.frames} frames in {st.st_size} bytes, not its key's",
                )
            table = os.pread(fd, layout.frames * DIGEST_BYTES, layout.table)
            digests = [table[i : i + DIGEST_BYTES] for i in range(0, len(table), DIGEST_BYTES)]
            if len(digests) != layout.frames:
                raise FrameCacheError(errno.EIO, f"{path}: checksum table truncated")
        except FrameCacheError as e:
            os.close(fd)
            self.discard(path, str(e))
            return None
        except FileNotFoundError:
            os.close(fd)
            return None
        with contextlib.suppress(PermissionError):  # last use, for LRU
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
        return Entry(fd, path, layout, digests)

    def discard(self, path: str, why: str) -> None:
        """Delete a bad entry (unless someone holds it): its frames are decoded again."""
        log.warning("frame cache: %s; deleting it, its frames are decoded again", why)
        with contextlib.suppress(OSError):
            _evict(path)

    def begin_fill(self, key: str) -> Entry | Fill | None:
        """Take the entry's fill lock without waiting: a ``Fill`` to write, the ``Entry`` if it was
        completed meanwhile, None while another consumer fills it (or fills are off)."""
        if self.fills_off:
            return None
        rel, path = self._path(key)
        lock = os.open(os.path.join(self.root, LOCKS_DIR, _lock_name(rel)), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return None
        entry = self.open(key)
        if entry is not None:
            os.close(lock)
            return entry
        for leftover in glob.glob(glob.escape(path) + ".*" + TMP_SUFFIX):  # a killed fill's (we hold its lock)
            with contextlib.suppress(OSError):
                _evict(leftover)
        return Fill(self, key, path, lock)

    def full(self, e: OSError) -> None:
        """A write failed (no space left, a quota, the disk, permissions): this consumer fills
        nothing more; said once per process and directory."""
        self.fills_off = True
        if self.root not in _warned_full:
            _warned_full.add(self.root)
            log.warning(
                "frame_cache_dir %s: %s; frames are decoded as without the cache from here (entries already "
                "there are still read)",
                self.root,
                os.strerror(e.errno or errno.EIO),
            )


def resolve_options(decode: DecodeOptions) -> DecodeOptions:
    """``decode`` with the frame cache's settings resolved where the dataset is built: an unusable
    ``frame_cache_dir`` is one error naming it now, ``frame_cache_bytes`` defaults as
    ``cache_max_bytes`` does, and GPU decoding turns the cache off (said once per process)."""
    if decode.frame_cache_dir is None:
        return decode
    if decode.video_decode_device != "cpu":
        global _warned_gpu
        if not _warned_gpu:
            _warned_gpu = True
            log.warning(
                "frame_cache_dir is ignored with video_decode_device=%r: the frame cache serves CPU decoding only",
                decode.video_decode_device,
            )
        return dataclasses.replace(decode, frame_cache_dir=None)
    check_owned(decode.frame_cache_dir, "frame_cache_dir")
    check_cache_dir(decode.frame_cache_dir, what="frame_cache_dir")
    if decode.frame_cache_bytes is None:
        decode = dataclasses.replace(decode, frame_cache_bytes=default_cache_bytes(decode.frame_cache_dir))
    return decode


_warned_gpu = False
_warned_full: set[str] = set()  # frame cache directories found full, in this process
