"""Filling the frame cache by sequential decoding, and serving a decode thread's frames from it.

One ``FrameServer`` per decode thread (``DecodePool``), touched only by that thread: the clips it
owns are admitted, filled, read and dropped there, in the order they were queued, so a clip's
state needs no lock. When an episode is admitted, each camera's entry is opened, or queued to be
filled; the thread fills one entry at a time, ``FILL_CHUNK`` frames in order per step, the steps
queued between its samples' decodes (a fill never holds up the samples behind it by more than a
chunk). A sample's frames come from the complete entry, from the part of the fill already
written, or from the fill advanced to them there and then, however far ahead they lie: its frames
are decoded in order once either way, so waiting on the fill costs no CPU, where decoding the
window at random would cost 2.2-2.6 decoded frames per frame on top of the fill (only a
consumer's first reads, ``STARTUP_READS``, decode frames far ahead at random, so that the first
batch does not wait for whole episodes). Otherwise only a clip with
no fill of this thread's to wait on (another consumer fills it, no room, a full disk, a decode
error) is decoded as without the cache: the same bits, in the same
order, whichever way they come (decoded by ``DecoderCache.uncounted``, resized by the same code).
Another consumer filling the same entry (its lock is held) is not waited for: this one decodes
its samples meanwhile and looks for the entry at each request.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..read.sources import ClipRef
from . import swscale
from .decoders import DecodeError, DecoderCache
from .frame_cache import Entry, Fill, FrameCache, FrameCacheError, Pixels, entry_key
from .planes import PlaneReader, PlanesUnsupported

log = logging.getLogger(__name__)

# Frames per fill step (one batched decode call), queued between the samples' decodes: ~0.1 s of
# 480p AV1. Measured on a cold epoch: 8 left 7x more frames decoded at emit than 32 (the fills lag
# behind emission while the pool's first episodes all fill at once), 16 3.5x.
FILL_CHUNK = 32
# A consumer's first reads (about a first batch's: 16 samples of 2 cameras) wait only on a fill
# under way, for frames up to FILL_AHEAD past it, and decode the others at random: the first
# batch waits for a few windows, not for the pool's first episodes decoded in full (~1 s more).
STARTUP_READS = 32
FILL_AHEAD = 64
# Clips whose episode left the pool before their fill was done are still filled (the next epoch
# reads them), at most this many waiting per thread: each holds its clip's bytes.
FILL_BACKLOG = 16
COUNTERS = (
    "frame_cache_hits",  # camera reads served from the cache (an entry or a fill's written part)
    "frame_cache_misses",  # camera reads decoded at emit while the cache is on
    "frame_cache_fills",  # entries this consumer wrote
    "frames_filled",
    "fill_cpu_seconds",
    "fill_write_cpu_seconds",  # of fill_cpu_seconds: the writes into the page cache (``Fill.write_seconds``)
    "cache_read_cpu_seconds",
    "frame_cache_evictions",
    "frame_cache_bad",  # entries found damaged on read (deleted, decoded again)
)


@dataclass
class _Clip:
    """One admitted clip on its thread: its entry, its fill, or neither yet."""

    clip: ClipRef
    key: str
    length: int
    size: tuple[int, int] | None
    entry: Entry | None = None
    fill: Fill | None = None
    elsewhere: bool = False  # another consumer holds its fill lock: look for the entry on each request
    left: bool = False  # its episode left the pool: filled for the next epoch, then forgotten
    planes: PlaneReader | None = None  # the fill keeps YUV planes (``FrameCache.pixels``), read by PyAV
    rgb: bool = False  # its frames cannot be kept as YUV: filled with torchcodec's RGB


class FrameServer:
    """A decode thread's frames through the frame cache (see the module docstring)."""

    def __init__(self, store: FrameCache, decoders: DecoderCache) -> None:
        self.store = store
        self.decoders = decoders
        self.clips: dict[tuple[str, int], _Clip] = {}
        self.queue: deque[tuple[str, int]] = deque()  # clips to fill, in admission order
        # clips whose episode left the pool before their fill started: filled once ``queue`` is
        # empty, so the fills of resident episodes (whose samples wait for them) come first
        self.later: deque[tuple[str, int]] = deque()
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.reads = 0  # camera reads asked of this thread (``STARTUP_READS``)

    def admit(self, clip: ClipRef, length: int, size: tuple[int, int] | None) -> None:
        """An episode's clip entered the pool: open its entry, or queue its fill."""
        ident = (clip.cache_key, clip.first_frame)
        if ident in self.clips:  # back before its fill was done
            self.clips[ident].left = False
            if ident in self.later:
                self.later.remove(ident)
                self.queue.append(ident)
            return
        key = entry_key(clip, length, size, self.decoders.decode.resize_mode, self.store.planar)
        if key is None:
            return
        state = self.clips[ident] = _Clip(clip, key, length, size, entry=self.store.open(key))
        if state.entry is None:
            self.queue.append(ident)

    def pending(self) -> bool:
        """Some admitted clip waits to be filled."""
        return bool(self.queue or self.later)

    def fill_step(self) -> None:
        """Decode the next chunk of the first clip waiting (after taking its fill lock)."""
        if not self.queue and self.later:
            self.queue.append(self.later.popleft())
        while self.queue:
            state = self.clips.get(self.queue[0])
            if state is None or state.entry is not None:
                self.queue.popleft()
                continue
            if state.fill is None and not self._begin(state):
                continue
            self._advance(state)
            return

    def _begin(self, state: _Clip) -> bool:
        """Take the clip's fill lock: True to fill it; else (its entry was completed meanwhile,
        another consumer fills it, fills are off) it leaves the queue."""
        try:
            got = self.store.begin_fill(state.key)
        except OSError as e:  # its lock cannot be made (the directory changed under the run)
            self.store.full(e)
            got = None
        if isinstance(got, Fill):
            state.fill = got
            if self.store.pixels == "yuv420p" and state.size is None and not state.rgb:
                try:
                    state.planes = PlaneReader(state.clip, state.length, self.decoders.decode.num_ffmpeg_threads)
                except PlanesUnsupported as e:
                    log.debug("frame cache: %s kept as RGB (%s)", state.clip.where, e)
                    state.rgb = True
            return True
        state.entry, state.elsewhere = got, got is None
        self._done(state)
        return False

    def _fill_to(self, state: _Clip, top: int) -> None:
        """Fill the clip's entry past frame ``top`` now, when its fill is this thread's to do
        (queued or under way): the sample waits on the fill instead of decoding at random."""
        ident = (state.clip.cache_key, state.clip.first_frame)
        while state.entry is None and ident in self.queue and (state.fill is None or state.fill.progress <= top):
            if state.fill is None and not self._begin(state):
                return
            self._advance(state)

    def drain(self) -> None:
        """Finish every fill waiting (the epoch's samples are all emitted; the next epoch reads them)."""
        while self.pending():
            self.fill_step()

    def _done(self, state: _Clip) -> None:
        """The clip is filled, or will not be: out of the queue; a clip whose episode left is forgotten."""
        ident = (state.clip.cache_key, state.clip.first_frame)
        if ident in self.queue:
            self.queue.remove(ident)
        if state.left:
            self._forget(state)

    def _advance(self, state: _Clip) -> None:
        """The fill's next chunk; the entry committed after its last, the fill abandoned on a
        decode error (the samples' own decodes report it), a full disk, or no room."""
        fill = state.fill
        assert fill is not None
        cpu, written = time.thread_time(), fill.write_seconds
        first = fill.progress
        try:
            if state.planes is not None:
                if not self._write_planes(state, fill, state.planes):
                    return
            else:
                frames = self.decoders.uncounted(
                    state.clip, range(first, min(first + FILL_CHUNK, state.length)), state.size
                )
                if first == 0 and not self._reserve(state, fill, (frames.shape[1], frames.shape[2], frames.shape[3])):
                    return
                fill.write(frames)
            if fill.progress == state.length:
                self._close_planes(state)
                state.entry, state.fill = fill.commit(), None
                self.counters["frame_cache_fills"] += 1
                self._done(state)
        except DecodeError:
            self._give_up(state)
        except OSError as e:  # a full disk, a quota, a disk error: decoded as without the cache
            self.store.full(e)
            self._give_up(state)
        finally:
            self.counters["fill_cpu_seconds"] += time.thread_time() - cpu
            self.counters["fill_write_cpu_seconds"] += fill.write_seconds - written
            self.counters["frames_filled"] += fill.progress - first

    def _reserve(
        self, state: _Clip, fill: Fill, shape: tuple[int, int, int], pixels: Pixels = "rgb", colorspace: int = 0
    ) -> bool:
        """Room for the whole entry, before its first frame; False (the fill given up) without it."""
        evicted = fill.reserve(state.length, shape, pixels, colorspace)
        if evicted is None:
            log.debug("frame cache: %s does not fit beside the entries in use", state.clip.where)
            self._give_up(state)
            return False
        self.counters["frame_cache_evictions"] += evicted
        return True

    def _write_planes(self, state: _Clip, fill: Fill, planes: PlaneReader) -> bool:
        """The next chunk of a fill keeping YUV planes; False when the fill ended here: no room, or
        frames that turn out not to be keepable (another size or format mid-clip, a pts off the
        table, a decode error: the clip stays first in the queue, to be filled again in RGB)."""
        try:
            shape = (3, planes.height, planes.width)
            if fill.progress == 0 and not self._reserve(state, fill, shape, "yuv420p", planes.colorspace):
                return False
            buf = swscale.scratch(planes.frame_bytes)
            for _ in range(min(FILL_CHUNK, state.length - fill.progress)):
                planes.read_into(buf)
                fill.write_stored(buf)
        except PlanesUnsupported as e:
            log.debug("frame cache: %s kept as RGB (%s)", state.clip.where, e)
            fill.abort()
            self._close_planes(state)
            state.fill, state.rgb = None, True
            return False
        return True

    def _close_planes(self, state: _Clip) -> None:
        if state.planes is not None:
            state.planes.close()
            state.planes = None

    def _give_up(self, state: _Clip) -> None:
        self._close_planes(state)
        if state.fill is not None:
            state.fill.abort()
            state.fill = None
        self._done(state)

    def frames(
        self, clip: ClipRef, indices: Sequence[int], size: tuple[int, int] | None, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Frames ``indices`` of the clip, uint8 (N, C, H, W) in the cache's memory order
        (channels-last, or contiguous when planar): from the cache, its fill advanced to them first
        (verified; read into ``into`` when it is such a tensor), else decoded
        (``DecoderCache.frames``)."""
        state = self.clips.get((clip.cache_key, clip.first_frame))
        if state is not None and state.size == size and indices:
            if state.entry is None and state.elsewhere:
                state.entry = self.store.open(state.key)
                state.elsewhere = state.entry is None
            top = max(int(i) for i in indices)
            self.reads += 1
            if self.reads > STARTUP_READS or (state.fill is not None and top < state.fill.progress + FILL_AHEAD):
                self._fill_to(state, top)
            frames = self._read(state, indices, top, into)
            if frames is not None:
                return frames
        self.counters["frame_cache_misses"] += 1
        frames = self.decoders.frames(clip, indices, size)
        # in the memory order of the cache's reads (``into``: the caller copies them there): a
        # batch's frames have one layout whichever way each came, or a slab transport's plan,
        # learnt from one batch, would not fit the next (its staged slabs retired, its values copied)
        if into is not None:
            return frames
        return frames.contiguous(memory_format=torch.contiguous_format if self.store.planar else torch.channels_last)

    def _read(self, state: _Clip, indices: Sequence[int], top: int, into: torch.Tensor | None) -> torch.Tensor | None:
        source: Entry | Fill | None = state.entry
        if source is None and state.fill is not None and top < state.fill.progress:
            source = state.fill
        if source is None:
            return None
        cpu = time.thread_time()
        try:
            frames = source.read([int(i) for i in indices], into)
        except FrameCacheError as e:
            self.counters["frame_cache_bad"] += 1
            if isinstance(source, Entry):
                source.close()
                self.store.discard(source.path, str(e))
                state.entry = None
                self.queue.append((state.clip.cache_key, state.clip.first_frame))  # fill it again
            else:
                log.warning("frame cache: %s; the fill is abandoned, its frames decoded again", e)
                self._give_up(state)
            return None
        finally:
            self.counters["cache_read_cpu_seconds"] += time.thread_time() - cpu
        self.counters["frame_cache_hits"] += 1
        return frames

    def drop(self, clip: ClipRef) -> None:
        """The clip's episode left the pool: its entry is released (evictable); a fill not done
        yet is still done, unless more than ``FILL_BACKLOG`` wait (the oldest not started goes)."""
        ident = (clip.cache_key, clip.first_frame)
        state = self.clips.get(ident)
        if state is None:
            return
        if state.entry is not None or ident not in self.queue:
            self._forget(state)
            return
        state.left = True
        if state.fill is None:  # not started: after the resident episodes' fills
            self.queue.remove(ident)
            self.later.append(ident)
            while len(self.later) > FILL_BACKLOG:
                self._forget(self.clips[self.later.popleft()])

    def _forget(self, state: _Clip) -> None:
        self.clips.pop((state.clip.cache_key, state.clip.first_frame), None)
        self._close_planes(state)
        if state.fill is not None:
            state.fill.abort()
            state.fill = None
        if state.entry is not None:
            state.entry.close()
            state.entry = None

    def close(self) -> None:
        """Release every entry and abandon every fill (end of an iteration)."""
        self.queue.clear()
        self.later.clear()
        for state in list(self.clips.values()):
            self._forget(state)
