"""The emission loop: one consumer's sampler order turned into samples shaped like LeRobot's.

``stream_samples`` admits episodes through the reader as the sampler reaches them, keeps the
pool, evicts an episode (and its decoders, and its cached mp4s once its queued samples are
decoded) after its last emission, and yields samples in sampler order while their frames decode
``decode_ahead`` samples ahead (where they are augmented too, ``augmented_when_decoded``). ``SampleLayout`` builds one sample from a resident episode:
tabular features, windows with ``_is_pad`` flags, image features and camera frames, the task.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..language import LanguageColumn
from ..storage import StorageLocation
from .augment import SampleTransforms
from .decoding.decoders import DecodePool, DecoderCache, auto_decode_threads, decode_image
from .decoding.frame_cache import FrameCache
from .decoding.frame_fill import COUNTERS as FRAME_COUNTERS
from .decoding.frame_fill import FrameServer
from .options import DecodeOptions, ReadOptions
from .plan.elastic import SubsetSampler
from .plan.partition import ConsumerPlan
from .plan.sampling import PoolSampler
from .plan.windows import window_indices
from .read.reader import EpisodeReader, HeldBytes, ReaderClosed
from .read.sources import EpisodeSource, ResidentEpisode
from .stats import StatSlot
from .transport import shutdown
from .transport.slabs import Staging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleLayout:
    """What a sample holds and in which shape: fixed when the dataset is built."""

    source_url: str
    tasks: tuple[str, ...]
    cameras: tuple[str, ...]
    image_keys: tuple[str, ...]  # image (not video) features, decoded from their bytes
    delta_offsets: Mapping[str, np.ndarray]  # windowed keys: frame offsets
    resize_sizes: Mapping[str, tuple[int, int]]  # cameras decoded at another size
    image_dtype: torch.dtype
    depth_cameras: frozenset[str] = frozenset()  # float32 depth as decoded (never scaled by 255, never cached)

    def sample(
        self, episode: ResidentEpisode, frame: int, decoders: DecodePool, staging: Staging | None = None, seq: int = 0
    ) -> dict[str, Any]:
        """One sample; its camera frames are futures (``DecodePool``) until ``emit``. With ``staging``,
        each camera's frames are written into the slot ``staging`` gives sample ``seq``."""
        item: dict[str, Any] = {}
        for name, column in episode.columns.items():
            if isinstance(column, LanguageColumn):  # the frame's own rows, never windowed (as LeRobot's)
                item[name] = column.row(frame)
                continue
            offsets = self.delta_offsets.get(name)
            idx, pad = (frame, None) if offsets is None else window_indices(frame, episode.length, offsets)
            if name in self.image_keys:
                at = f"{self.source_url}: episode {episode.episode_index} feature {name} frame"
                frames = [decode_image(column[i], f"{at} {int(i)}") for i in np.atleast_1d(idx)]
                value = self.images(torch.stack(frames))
                item[name] = value if pad is not None else value[0]
            elif column.dtype == object:  # a string feature: the string, as LeRobot gives it
                item[name] = column[idx].tolist() if pad is not None else column[idx]
            else:
                # a copy of the row (never a view of the column), as torch.tensor makes it in a third of its time
                item[name] = torch.from_numpy(np.array(column[idx]))
            if pad is not None:
                item[f"{name}_is_pad"] = torch.from_numpy(pad)
        for cam in self.cameras:
            offsets = self.delta_offsets.get(cam)
            size = self.resize_sizes.get(cam)
            slot = None if staging is None else staging.destination(seq, cam)
            depth = cam in self.depth_cameras
            uint8 = self.image_dtype == torch.uint8 and not depth  # the frame cache may read into the slot
            if offsets is None:
                into = None if slot is None or not uint8 else slot.unsqueeze(0)
                item[cam] = decoders.submit(
                    episode.clips[cam], [frame], size, self._finish(False, slot, staging, depth), into=into
                )
            else:
                idx, pad = window_indices(frame, episode.length, offsets)
                into = None if not uint8 else slot
                item[cam] = decoders.submit(
                    episode.clips[cam], idx.tolist(), size, self._finish(True, slot, staging, depth), into=into
                )
                item[f"{cam}_is_pad"] = torch.from_numpy(pad)
        task_index = episode.columns["task_index"]
        assert isinstance(task_index, np.ndarray)
        item["task"] = self.tasks[int(task_index[frame])]
        return item

    def images(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames in the sample's dtype."""
        return frames.float().div_(255) if self.image_dtype == torch.float32 else frames

    def _finish(
        self, window: bool, slot: torch.Tensor | None, staging: Staging | None, depth: bool = False
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """What the decode thread makes of a camera's decoded frames: the camera's value (the window,
        or its one frame), written into ``slot`` when it fits there (the same values ``images``
        gives, in the slab the batch will travel in, while the frames are still in cache). A depth
        camera's frames are its values already (float32, dequantized)."""

        def finish(frames: torch.Tensor) -> torch.Tensor:
            value = frames if window else frames[0]
            dtype = value.dtype if depth else self.image_dtype
            if slot is None or staging is None or not _fits(value, slot, dtype):
                return value if depth else self.images(value)
            if value.data_ptr() == slot.data_ptr():  # read into the slot already (the frame cache)
                return slot
            start = time.thread_time()
            slot.copy_(value)
            if self.image_dtype == torch.float32 and not depth:
                slot.div_(255)
            staging.staged(time.thread_time() - start)
            return slot

        return finish


def _fits(value: torch.Tensor, slot: torch.Tensor, dtype: torch.dtype) -> bool:
    return value.device.type == "cpu" and value.shape == slot.shape and slot.dtype == dtype


def augmented_when_decoded(
    item: dict[str, Any], transforms: SampleTransforms, decoders: DecodePool
) -> Future[dict[str, Any]]:
    """The sample augmented by ``transforms`` once its frames are decoded, on the decode pool's
    shared threads (``DecodePool.after``). Why there, not in the consumer: the transforms cost more
    than the decoding (LeRobot's default set, 29 CPU ms per 480p two-frame window, decoding them
    about 6), and their torch kernels release the GIL, so those threads augment samples in parallel
    and ahead of the consumer, while a training step runs in the consumer's thread. Each sample
    draws from a generator of its own (``augment``): which thread runs it, and when, changes no bit."""

    def augment() -> dict[str, Any]:
        for name, value in item.items():
            if isinstance(value, Future):
                item[name] = value.result()  # a decode's error is raised where the sample is emitted
        return transforms(item)

    return decoders.after([value for value in item.values() if isinstance(value, Future)], augment)


def _releaser(episode: ResidentEpisode, held: HeldBytes) -> Callable[[], None]:
    """What lets an evicted episode go: its bytes uncounted, its cached mp4s released."""

    def release() -> None:
        held.release(episode.nbytes)
        if episode.release is not None:
            episode.release()

    return release


def emit(item: dict[str, Any] | Future[dict[str, Any]], decoders: DecodePool, stats: StatSlot) -> dict[str, Any]:
    """The sample with its decoded frames in place of their futures (an augmented sample: once augmented)."""
    if isinstance(item, Future):
        item = item.result()
    for name, value in item.items():
        if isinstance(value, Future):
            item[name] = value.result()
    stats.add("frames_emitted", 1)
    stats.set("decoder_hits", decoders.counter("hits"))
    stats.set("decoder_misses", decoders.counter("misses"))
    stats.set("decoder_evictions", decoders.counter("evictions"))
    stats.set("decode_seconds", decoders.counter("decode_seconds"))
    stats.set("decode_cpu_seconds", decoders.counter("decode_cpu_seconds"))
    stats.set("frames_decoded", decoders.counter("frames_decoded"))
    _frame_cache_stats(decoders, stats)
    return item


def _frame_cache_stats(decoders: DecodePool, stats: StatSlot) -> None:
    if decoders.frame_cache:
        for name in FRAME_COUNTERS:
            stats.set(name, decoders.counter(name))


def decode_pool(
    decode: DecodeOptions, location: StorageLocation, stats: StatSlot, rank_cores: int | None = None
) -> DecodePool:
    """This iteration's decode threads, their decoder caches sharing ``decoder_cache_size``."""
    threads = decode.decode_threads
    if threads is None:
        threads = auto_decode_threads(decode.video_decode_device, rank_cores)
    stats.set("decode_threads", threads)
    capacity = decode.decoder_cache_size
    assert capacity is not None  # resolved by the dataset
    per_thread = -(-capacity // max(1, threads))  # clips are spread over the threads
    store = None
    if decode.frame_cache_dir is not None and decode.video_decode_device == "cpu":
        assert decode.frame_cache_bytes is not None  # resolved by the dataset
        # frames augmented next are cached planar: the transforms cost less on contiguous frames
        store = FrameCache(
            decode.frame_cache_dir,
            decode.frame_cache_bytes,
            planar=decode.image_transforms is not None,
            pixels=decode.frame_cache_pixels,
        )
    return DecodePool(
        threads,
        lambda: DecoderCache(per_thread, decode, location),
        None if store is None else (lambda decoders: FrameServer(store, decoders)),
    )


def stream_samples(
    open_source: Callable[[], EpisodeSource],
    plan: ConsumerPlan,
    sampler: PoolSampler | SubsetSampler,
    emitted: int,
    stats: StatSlot,
    *,
    layout: SampleLayout,
    read: ReadOptions,
    decode: DecodeOptions,
    location: StorageLocation,
    equal_samples_per_rank: bool,
    rank_cores: int | None = None,
    stage: bool = False,
    transforms: SampleTransforms | None = None,
) -> Iterator[dict[str, Any]]:
    """The consumer's samples after the ``emitted`` ones its sampler was fast-forwarded over
    (``rank_cores``: this rank's cores as counted in its own process, ``cpus.cores_per_rank``).
    ``stage``: these are the samples a DataLoader worker batches as they come (the worker's dataset
    itself, no wrapper, no mixture), so frames may be decoded into their batch's slab (``Staging``).
    ``transforms``: each sample's augmentation once its frames are decoded (``augment``)."""
    per_pass = sum(plan.lengths)
    if sampler.num_samples == emitted or shutdown.exiting():
        return
    # This iteration's own source (never shared with another iterator or process): its
    # reader thread is the only one reading it, and it is closed here once that thread stopped.
    source = open_source()
    # bound as locals: when this generator is closed at interpreter exit, module globals may be gone
    finalizing, exiting, leave = sys.is_finalizing, shutdown.exiting, shutdown.leave
    assert read.prefetch_episodes is not None  # resolved by the dataset
    reader = EpisodeReader(
        source, plan.episodes, sampler.admission_order(), read.prefetch_episodes, skip_bad=read.on_error == "skip"
    )
    decoders = decode_pool(decode, location, stats, rank_cores)
    # frames decoded straight into the slabs of this worker's SlabCollate (CPU frames only)
    staging = Staging() if stage and decode.video_decode_device == "cpu" else None
    lookahead = decode.decode_ahead or 2 * decoders.threads
    pool: dict[tuple[int, int], ResidentEpisode | None] = {}  # None: skipped (on_error="skip")
    pending: deque[dict[str, Any] | Future[dict[str, Any]]] = deque()  # samples being decoded (augmented), in order
    releases: deque[tuple[int, Callable[[], None]]] = deque()  # (samples queued before it, release)
    queued = done = 0
    owed = 0  # skipped samples not yet replaced (equal-count mode)
    consumer = threading.current_thread()
    own_thread = consumer is not threading.main_thread()  # a feeder's, a user's: exit waits for it
    if own_thread:
        shutdown.enter(consumer)
    try:
        for emission in sampler:
            key = (emitted // per_pass, emission.position)
            emitted += 1
            while key not in pool:
                got, episode, waited = reader.next()
                pool[got] = episode
                stats.add("admissions", 1)
                if episode is None:
                    stats.add("episodes_skipped", 1)
                else:
                    stats.add("bytes_read", episode.nbytes)
                    for cam in layout.cameras:  # the frame cache's entry opened, or its fill queued
                        decoders.admit(episode.clips[cam], episode.length, layout.resize_sizes.get(cam))
                stats.add("wait_seconds", waited)
            episode = pool[key]
            picks = [] if episode is None else [(episode, emission.frame)]
            if episode is None:  # its bytes were bad: its samples are dropped, never wrong
                stats.add("samples_skipped", 1)
                if emission.last:
                    del pool[key]
                owed += equal_samples_per_rank
            if owed:  # equal-count mode: repeat frames of a good resident episode instead
                found = (key, episode) if episode is not None else next(((k, e) for k, e in pool.items() if e), None)
                if found is not None:
                    (_, position), good = found
                    sampled = plan.lengths[position]  # frames the sampler may emit (none of drop_n_last_frames)
                    picks += [(good, (emission.frame + 1 + i) % sampled) for i in range(owed)]
                    stats.add("samples_substituted", owed)
                    owed = 0
            for chosen, frame in picks:
                item = layout.sample(chosen, frame, decoders, staging, queued)
                pending.append(item if transforms is None else augmented_when_decoded(item, transforms, decoders))
                queued += 1
            if episode is None:
                continue
            if emission.last:
                del pool[key]
                stats.add("evictions", 1)
                for clip in episode.clips.values():
                    decoders.release(clip)
                    if clip.data is not None:
                        decoders.drop(clip.cache_key)
                # its bytes (and its cached mp4s), once its queued samples are decoded
                releases.append((queued, _releaser(episode, reader.held)))
            stats.set("pool_occupancy", len(pool))
            stats.set("resident_bytes_peak", reader.held.peak)
            while len(pending) > lookahead:
                yield emit(pending.popleft(), decoders, stats)
                done += 1
                while releases and releases[0][0] <= done:
                    releases.popleft()[1]()
            for name, value in source.io_stats().items():
                stats.set(name, value)
        while pending:
            yield emit(pending.popleft(), decoders, stats)
        decoders.finish_fills()  # the entries the next epoch reads
        _frame_cache_stats(decoders, stats)
        if owed:
            log.warning(
                "on_error='skip': %d skipped sample(s) found no good episode to repeat; this consumer "
                "yielded fewer samples than the other ranks expect (DDP may wait at epoch end)",
                owed,
            )
        for name, value in source.io_stats().items():
            stats.set(name, value)
    except ReaderClosed:
        return  # closed under this stream at interpreter exit (``shutdown``): it ends here, quietly
    except RuntimeError:
        if exiting():  # "cannot schedule new futures after interpreter shutdown" (the decode threads)
            return
        raise
    finally:
        if own_thread:
            leave(consumer)
        if staging is not None:
            staging.close()
        for thing in (reader, source, decoders):
            try:
                thing.close()
            except Exception:
                # A generator left open until the interpreter exits is closed while modules are
                # torn down (concurrent.futures' own globals already None); its threads have been
                # stopped by then and the process is going: nothing to release, nothing to report.
                if not finalizing():
                    raise
