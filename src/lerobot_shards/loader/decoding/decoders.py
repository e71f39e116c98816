"""Decoding at emit time: a bounded LRU of torchcodec decoders, one batched call per camera.

Decoders are built lazily inside the process that iterates (never in the DataLoader parent:
forked decoders share file offsets), and the cache is bounded because each decoder holds
megabytes of codec state and, for source mp4s, an open file.

The decode-time resize (for raw datasets and full-size shards) is one batched uint8 resize of
each call's frames after decoding. torchcodec 0.13's decoder transforms (``VideoDecoder(
transforms=[Resize(...)])``) do the same inside FFmpeg, but measured 3-4x slower per frame on
480p (``benchmarks/results/resize-2026-11.md``): they cost more than the decode itself, the uint8 resize less.

``DecodePool`` spreads decoding over threads inside one process: torchcodec releases the GIL
while it decodes, so threads decode in parallel (also with DataLoader ``num_workers=0``), and
overlap decoding with collation and the inter-process copy of finished samples.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import av
import numpy as np
import torch
from torch.utils.data import get_worker_info

from ...cpus import cores_per_rank
from ...depth import dequantize
from ...exceptions import LeRobotShardsError
from ...mp4cut import Mp4CutUnsupported, Mp4File
from ...redaction import redact
from ...resize import plan_transform
from ...storage import StorageLocation
from ...timeouts import READ_HINT, is_timeout, open_bounded
from ...torch_pair import VideoDecoder, set_cuda_backend
from ..options import DecodeOptions
from ..read.sources import ClipRef
from .depth_frames import DepthClip
from .transforms import transform_rgb

if TYPE_CHECKING:
    from .frame_fill import FrameServer

log = logging.getLogger(__name__)

# A raw mp4 decoded straight from object storage (no cache_dir): an LRU of 4 MiB blocks, 64 MiB per
# open file. The filesystem's default read-ahead window (s3fs: 50 MB from each seek) refetched
# tens of MB per random-access sample, since every seek outside the window starts a new one.
REMOTE_BLOCK_BYTES = 4 << 20
REMOTE_BLOCKS = 16
MAX_AUTO_DECODE_THREADS = 8
_warned_fallback: set[tuple[str, str]] = set()  # (device, codec): one warning per process
_warned_depth: set[str] = set()  # devices told once that depth decodes on the CPU


def _enter_cuda_backend(stack: contextlib.ExitStack, backend: str) -> None:
    """torchcodec's backend switch; torchcodec before 0.13 calls its NVDEC backend ``"beta"``."""
    try:
        stack.enter_context(set_cuda_backend(backend))
    except ValueError:
        if backend != "nvdec":
            raise
        stack.enter_context(set_cuda_backend("beta"))


def fallback_message(where: str, device: str, codec: str, status: str) -> str:
    """The one line a user sees when this GPU cannot decode a clip."""
    return (
        f"{where}: {device} cannot decode this {codec or 'video'} stream on NVDEC ({status}); "
        f"convert with `lerobot-shards convert --reencode h264 --gop 2` for GPU decoding"
    )


def source_frame_mappings(file: Any) -> str | None:
    """torchcodec ``custom_frame_mappings`` of a source mp4 read from storage, from its sample tables.

    Why: torchcodec's exact seek mode demuxes the whole file before its first frame, so a raw camera
    file on the Hub or in a bucket (LeRobot's are up to 500 MB) was read whole to decode one episode.
    The moov's tables (stts, stss) give every frame's pts, duration and key flag; the reads are the
    file's start and its moov, which FFmpeg reads anyway when it opens the file. Frames are then
    found as the exact mode finds them: pts = dts (tested against the demuxer's packets). None,
    and the exact scan, where that does not hold or the tables are not read (B-frames, a composition
    offset, a fragmented or unusual file: ``mp4cut`` refuses what it does not know).
    """
    try:
        with Mp4File(file) as mp4:
            track = mp4.track
    except Mp4CutUnsupported:
        return None
    if track.composition_offset:
        return None
    frames = [
        {"pts": int(p), "duration": int(d), "key_frame": int(k)}
        for p, d, k in zip(track.dts.tolist(), track.durations.tolist(), track.sync.tolist())
    ]
    return json.dumps({"frames": frames})


_plan_transform = functools.lru_cache(maxsize=64)(plan_transform)  # pure: once per (size, target, mode)


class DecodeError(LeRobotShardsError, RuntimeError):
    """A clip does not decode; the message names dataset, shard, episode, camera and frames."""


class DecoderCache:
    """LRU cache of ``VideoDecoder`` by clip, with hit/miss/eviction counters."""

    def __init__(
        self, capacity: int, decode: DecodeOptions | None = None, location: StorageLocation | None = None
    ) -> None:
        """``decode``: the dataset's decode options, whole; ``location``: the storage a remote clip's
        URL is opened on (its file system and timeouts; None: clips are local or carry their bytes)."""
        if capacity < 1:
            raise ValueError(f"decoder cache capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.decode = decode = decode or DecodeOptions()
        self.device = decode.video_decode_device
        self.location = location
        # a clip's decoder (a depth clip's PyAV ``DepthClip``) and the remote file it reads, if any
        self._decoders: OrderedDict[str, tuple[VideoDecoder | DepthClip, Any]] = OrderedDict()
        # An mp4 that storage did not deliver: the samples queued behind the first failure get its
        # error at once instead of each waiting out the timeouts again (until the clip is dropped).
        self._unreadable: dict[str, DecodeError] = {}
        self.hits = self.misses = self.evictions = 0
        self.decode_seconds = 0.0
        self.decode_cpu_seconds = 0.0
        self.frames_decoded = 0

    def _decoder(self, clip: ClipRef) -> VideoDecoder | DepthClip:
        entry = self._decoders.get(clip.cache_key)
        if entry is not None:
            self.hits += 1
            self._decoders.move_to_end(clip.cache_key)
            return entry[0]
        self.misses += 1
        handle = None
        if clip.data is not None:
            source: Any = clip.data
        elif "://" in (clip.url or ""):
            url = str(clip.url)
            location = self.location or StorageLocation(url)
            handle = open_bounded(location.fs, location.path(url), block_size=REMOTE_BLOCK_BYTES, blocks=REMOTE_BLOCKS)
            source = handle
        else:
            source = clip.url
        mappings = clip.frame_mappings
        if mappings is None and handle is not None:
            try:
                mappings = source_frame_mappings(handle)
            except Exception:
                handle.close()
                raise
        if clip.depth is not None:  # PyAV, on the CPU: torchcodec gives 8-bit RGB (see depth_frames)
            try:
                depth = DepthClip(source, mappings)
            except Exception:
                if handle is not None:
                    handle.close()
                raise
            return self._keep(clip, depth, handle)
        kwargs: dict[str, Any] = {"device": self.device, "num_ffmpeg_threads": self.decode.num_ffmpeg_threads}
        if mappings is not None:
            kwargs["custom_frame_mappings"] = mappings
        else:
            kwargs["seek_mode"] = "exact"
        try:
            with contextlib.ExitStack() as stack:
                if self.device != "cpu":
                    _enter_cuda_backend(stack, self.decode.cuda_decode_backend)
                decoder = VideoDecoder(source, **kwargs)
        except Exception as e:
            if handle is not None:
                handle.close()
            if isinstance(e, RuntimeError) and "fork" in str(e) and self.device != "cpu":
                raise RuntimeError(
                    "CUDA cannot start in a forked DataLoader worker: build the DataLoader with "
                    "multiprocessing_context='spawn' for video_decode_device='cuda'"
                ) from e
            raise
        _check_size(decoder, clip)
        return self._keep(clip, decoder, handle)

    def _keep(self, clip: ClipRef, decoder: VideoDecoder | DepthClip, handle: Any) -> VideoDecoder | DepthClip:
        self._decoders[clip.cache_key] = (decoder, handle)
        while len(self._decoders) > self.capacity:
            _close(self._decoders.popitem(last=False)[1])
            self.evictions += 1
        return decoder

    def drop(self, cache_key: str) -> None:
        """Forget a clip's decoder (its episode left the pool and nothing else shares it)."""
        self._unreadable.pop(cache_key, None)
        self._forget(cache_key)

    def _forget(self, cache_key: str) -> None:
        entry = self._decoders.pop(cache_key, None)
        if entry is not None:
            _close(entry)

    def frames(self, clip: ClipRef, indices: Sequence[int], size: tuple[int, int] | None = None) -> torch.Tensor:
        """Frames ``indices`` of the episode (not of the file) as uint8 (N, C, H, W), one call;
        resized to ``size`` (height, width) as ``resize_mode`` says when given."""
        start, cpu = time.perf_counter(), time.thread_time()
        frames = self.uncounted(clip, indices, size)
        self.decode_seconds += time.perf_counter() - start
        self.decode_cpu_seconds += time.thread_time() - cpu  # decoding runs in this thread (one FFmpeg thread)
        self.frames_decoded += len(indices)
        return frames

    def uncounted(self, clip: ClipRef, indices: Sequence[int], size: tuple[int, int] | None = None) -> torch.Tensor:
        """``frames``, uncounted: the frame cache's fill (``frame_fill``) decodes through this and
        counts its own time, so decode counters stay those of decoding at emit."""
        unreadable = self._unreadable.get(clip.cache_key)
        if unreadable is not None:
            raise unreadable
        try:
            decoder = self._decoder(clip)
            at = [clip.first_frame + int(i) for i in indices]
            if isinstance(decoder, DepthClip):
                return self._depth(clip, decoder.codes(at), size)
            if isinstance(indices, range) and indices.step == 1 and indices:
                # the frame cache's fills: a run decoded as one range, 0.13-0.19 ms of CPU less per
                # 480p frame than the same frames listed (the same bits)
                frames = decoder.get_frames_in_range(at[0], at[-1] + 1).data
            else:
                frames = decoder.get_frames_at(at).data
        except Exception as e:  # torchcodec's errors name neither the clip nor the frame
            self._forget(clip.cache_key)  # a decoder that failed may be left mid-stream
            wanted = ", ".join(str(int(i)) for i in indices)
            error = DecodeError(redact(f"{clip.where}: cannot decode frame(s) {wanted} ({type(e).__name__}: {e})"))
            remote = clip.data is None and "://" in (clip.url or "")
            if remote and is_timeout(e):  # not the video's fault: say what to check
                error = DecodeError(
                    redact(f"{clip.where}: cannot read frame(s) {wanted} ({type(e).__name__}: {e}); {READ_HINT}")
                )
                self._unreadable[clip.cache_key] = error
            # an mp4 read from storage: its failure is not chained, its text names the endpoint
            raise error from (None if remote else e)
        if self.device != "cpu":
            self._check_fallback(decoder, clip)
            frames = frames.to(self.device)  # a CPU fallback's frames join the other clips' device
        if size is not None:
            t = _plan_transform(tuple(frames.shape[-2:]), tuple(size), self.decode.resize_mode)
            frames = transform_rgb(frames, t) if t is not None else frames
        return frames

    def _depth(self, clip: ClipRef, codes: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
        """A depth clip's codes dequantized as LeRobot does, float32 (N, 1, H, W) in the unit asked
        for, on the CPU (then moved to the other clips' device, said once per process)."""
        assert clip.depth is not None and size is None  # depth cameras are never resized (dataset refuses)
        frames = dequantize(codes, clip.depth, self.decode.depth_output_unit)
        if self.device != "cpu":
            if self.device not in _warned_depth:
                _warned_depth.add(self.device)
                warnings.warn(
                    f"{clip.where}: depth maps decode on the CPU (PyAV, 12-bit), not on {self.device}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            frames = frames.to(self.device)
        return frames

    def _check_fallback(self, decoder: VideoDecoder, clip: ClipRef) -> None:
        """torchcodec silently decodes on the CPU what NVDEC cannot: say so once, or refuse if strict.

        The status is known once a frame is decoded (at creation for the NVDEC backend).
        """
        status = getattr(decoder, "cpu_fallback", None)
        if not status:
            return
        codec = str(getattr(decoder.metadata, "codec", "") or "")
        message = fallback_message(clip.url or clip.cache_key, self.device, codec, str(status))
        if self.decode.strict_cuda_decode:
            raise RuntimeError(f"{message} (strict_cuda_decode=True)")
        if (self.device, codec) not in _warned_fallback:
            _warned_fallback.add((self.device, codec))
            warnings.warn(f"{message}; decoding it on the CPU instead", RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        """Release every decoder and the files they hold (end of an iteration)."""
        for entry in self._decoders.values():
            _close(entry)
        self._decoders.clear()


def _close(entry: tuple[VideoDecoder | DepthClip, Any]) -> None:
    """A cached decoder's resources: a depth clip's PyAV container, the remote file it read."""
    decoder, handle = entry
    if isinstance(decoder, DepthClip):
        decoder.close()
    if handle is not None:
        handle.close()


def auto_decode_threads(device: str, rank_cores: int | None = None) -> int:
    """Decode threads for ``decode_threads=None``, chosen by where the dataset is iterated.

    In the main process (``num_workers=0``) one thread per core (at most 8) decodes in parallel
    with no inter-process copy of frames: on 2 cores this measured at the pure-decode limit,
    above what 2 worker processes reach (``benchmarks/README.md``). In a DataLoader worker, the
    cores left per worker (at most 8): with one, decoding runs beside the worker's collation; with
    more, a sample's cameras also decode in parallel (as LeRobot 0.6.1 does); with more workers than
    cores, none (inline), since more threads would only contend. NVDEC decodes on the GPU, whose
    decoder is not faster for more host threads.
    """
    if device != "cpu":
        return 0
    info = get_worker_info()
    # ranks sharing a node share its cores (LOCAL_WORLD_SIZE): the rank's share, as its own process
    # counted it (``rank_cores``; the dataset counts them where it is built), else counted here
    cores = cores_per_rank() if rank_cores is None else rank_cores
    if info is None:
        return max(1, min(MAX_AUTO_DECODE_THREADS, cores))
    return min(MAX_AUTO_DECODE_THREADS, cores // info.num_workers)


def _check_size(decoder: VideoDecoder, clip: ClipRef) -> None:
    """Warn (once per process and pair of sizes) when a clip's frames are not the size its camera's
    feature declares: the frames are still the ones asked for, but a policy built from the declared
    shapes would not fit them (wrong metadata, as some conversion tools wrote; LeRobot trains on
    such datasets, so this warns instead of refusing)."""
    if clip.size is None:
        return
    h, w = decoder.metadata.height, decoder.metadata.width
    if h is None or w is None or (h, w) == clip.size:
        return
    got, (want_h, want_w) = (h, w), clip.size
    if (got, clip.size) in _warned_size:
        return
    _warned_size.add((got, clip.size))
    warnings.warn(
        redact(
            f"{clip.where}: the video's frames are {w}x{h} (width x height), but the camera's feature "
            f"declares {want_w}x{want_h}; samples hold the frames as decoded"
        ),
        RuntimeWarning,
        stacklevel=2,
    )


_warned_size: set[tuple[tuple[int, int], tuple[int, int]]] = set()  # (decoded, declared): once per process


class DecodePool:
    """Decode clips on ``threads`` threads (0: inline), each thread owning its own decoders.

    A torchcodec decoder is not safe to share between threads, so every clip is owned by one
    thread, given round-robin when the clip is first seen (a hash would often give a sample's
    two cameras to the same thread); that thread's ``DecoderCache`` holds its decoder, and a
    ``drop`` is queued behind that clip's pending decodes (each thread runs its queue in order).
    Results come back as futures: the caller keeps its own emission order, so what a sample
    holds never depends on the thread count or timing.

    With a frame cache (``make_server``), each thread's ``FrameServer`` serves its clips' frames
    and fills their entries: ``admit`` queues a fill on the clip's thread, and the fill's steps
    are queued on that thread one at a time, between the samples' decodes (inline: one step
    before each sample).

    ``after`` runs work that follows a sample's decodes (its image transforms) on ``threads`` more
    threads shared by all samples: the first free one takes it. Run on the thread that finished a
    sample's last camera instead, it piled up on one decode thread (the one that fell behind,
    augmenting, kept finishing last) while the other idled: 1.2 of 2 cores busy.
    """

    def __init__(
        self,
        threads: int,
        make_cache: Callable[[], DecoderCache],
        make_server: Callable[[DecoderCache], FrameServer] | None = None,
    ) -> None:
        self.threads = threads
        self._caches = [make_cache() for _ in range(max(1, threads))]
        self._servers = None if make_server is None else [make_server(c) for c in self._caches]
        self._filling = [False] * len(self._caches)  # a fill step queued on the thread (touched by it alone)
        self._inline: deque[Callable[[], None]] = deque()  # fill steps without threads
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"decode-{i}") for i in range(threads)]
        self._after = (
            ThreadPoolExecutor(threads, thread_name_prefix="after-decode", initializer=_one_intra_op_thread)
            if threads
            else None
        )
        self._owner: dict[str, int] = {}  # clip -> its thread, until dropped
        self._turn = 0

    def _route(self, cache_key: str) -> int:
        owner = self._owner.get(cache_key)
        if owner is None:
            owner = self._owner[cache_key] = self._turn % len(self._caches)
            self._turn += 1
        return owner

    def submit(
        self,
        clip: ClipRef,
        indices: Sequence[int],
        size: tuple[int, int] | None,
        then: Callable[[torch.Tensor], Any],
        into: torch.Tensor | None = None,
    ) -> Future[Any]:
        """``then(frames)`` of the clip's ``indices`` at ``size`` (see ``DecoderCache.frames``), as a
        future. ``into``: a uint8 (N, C, H, W) tensor the frame cache may read them into (a slab's
        slot: ``then`` finds them in place)."""
        i = self._route(clip.cache_key)
        if self._servers is None:
            cache = self._caches[i]

            def frames() -> torch.Tensor:
                return cache.frames(clip, indices, size)
        else:
            server = self._servers[i]

            def frames() -> torch.Tensor:
                return server.frames(clip, indices, size, into)

        if self._threads:
            return self._threads[i].submit(lambda: then(frames()))
        if self._inline:
            self._inline.popleft()()
        done: Future[Any] = Future()
        try:
            done.set_result(then(frames()))
        except BaseException as e:
            done.set_exception(e)
        return done

    def after(self, futures: Sequence[Future[Any]], task: Callable[[], Any]) -> Future[Any]:
        """``task()`` as a future, run once every one of ``futures`` is done, on the first free of the
        shared threads (without threads: inline, its decodes being done). Its error, or the pool's
        being closed, is the future's exception."""
        done: Future[Any] = Future()
        left = [len(futures)]
        lock = threading.Lock()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(task())
                except BaseException as e:  # raised where the result is taken
                    done.set_exception(e)

        def ready(_: Future[Any] | None = None) -> None:
            with lock:
                left[0] -= 1
                if left[0] > 0:
                    return
            if self._after is None:
                run()
                return
            try:
                self._after.submit(run)
            except RuntimeError as e:  # closed: the iteration is over
                done.set_exception(e)

        if not futures:
            left[0] = 1
            ready()
        for future in futures:
            future.add_done_callback(ready)
        return done

    @property
    def frame_cache(self) -> bool:
        """Frames go through a frame cache (``make_server`` was given)."""
        return self._servers is not None

    def admit(self, clip: ClipRef, length: int, size: tuple[int, int] | None) -> None:
        """An episode's clip entered the pool: with a frame cache, open its entry or queue its fill."""
        if self._servers is None:
            return
        i = self._route(clip.cache_key)
        server = self._servers[i]

        def admit() -> None:
            server.admit(clip, length, size)
            self._next_fill(i)

        self._on_thread(i, admit) if self._threads else admit()

    def release(self, clip: ClipRef) -> None:
        """The clip's episode left the pool: its frame cache entry is released (after the decodes
        queued for it), before ``drop``."""
        i = self._owner.get(clip.cache_key)
        if self._servers is None or i is None:
            return
        server = self._servers[i]
        self._on_thread(i, lambda: server.drop(clip)) if self._threads else server.drop(clip)

    def finish_fills(self) -> None:
        """Finish the fills still waiting, on their threads (the stream's samples are all emitted)."""
        if self._servers is None:
            return
        if not self._threads:
            for server in self._servers:
                server.drain()
            return
        for done in [t.submit(s.drain) for t, s in zip(self._threads, self._servers)]:
            done.result()

    def _next_fill(self, i: int) -> None:
        """Queue thread ``i``'s next fill step, unless one is queued or nothing waits (on thread ``i``)."""
        assert self._servers is not None
        server = self._servers[i]
        if self._filling[i] or not server.pending():
            return
        self._filling[i] = True

        def step() -> None:
            self._filling[i] = False
            server.fill_step()
            self._next_fill(i)

        if self._threads:
            self._on_thread(i, step)
        else:
            self._inline.append(step)

    def _on_thread(self, i: int, task: Callable[[], None]) -> None:
        """Run ``task`` on thread ``i`` after what is queued there; nothing once the pool closes.
        Nobody waits for it: an unexpected error is logged, not lost."""
        try:
            done = self._threads[i].submit(task)
        except RuntimeError:  # shut down: the iteration is over
            return
        done.add_done_callback(_log_failure)

    def drop(self, cache_key: str) -> None:
        """Forget a clip's decoder once the decodes already queued for it are done."""
        i = self._owner.pop(cache_key, None)
        if i is None:
            return
        if self._threads:
            self._threads[i].submit(self._caches[i].drop, cache_key)
        else:
            self._caches[i].drop(cache_key)

    def counter(self, name: str) -> float:
        """A ``DecoderCache`` counter (hits, misses, evictions, decode_seconds, decode_cpu_seconds,
        frames_decoded) or a ``FrameServer`` one (``frame_fill.COUNTERS``) summed."""
        if self._servers is not None and name in self._servers[0].counters:
            return sum(s.counters[name] for s in self._servers)
        return sum(getattr(c, name) for c in self._caches)

    def close(self) -> None:
        """Stop the threads (queued decodes are cancelled, running ones finish), then the frame
        cache's entries and fills, then the decoders."""
        for t in self._threads:
            t.shutdown(wait=True, cancel_futures=True)
        if self._after is not None:
            self._after.shutdown(wait=True, cancel_futures=True)
        for s in self._servers or ():
            s.close()
        for c in self._caches:
            c.close()


def _one_intra_op_thread() -> None:
    """This thread's torch operations on one core (torch's intra-op threads are per calling thread).

    The threads running ``DecodePool.after`` are as many as the cores, beside the decode threads
    and a training step: an intra-op team of their own per thread only contends (LeRobot's image
    transforms on 480p frames under load: 49-79 CPU ms a frame with 2 intra-op threads, 24-25 with
    one). A DataLoader worker runs its transforms so too (torch sets its workers to one thread).
    Side effect: torch also takes it as the count for threads started after (the training
    thread's own count stays)."""
    torch.set_num_threads(1)


def _log_failure(done: Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("frame cache: a background step failed", exc_info=done.exception())


def decode_image(data: bytes, where: str = "image") -> torch.Tensor:
    """An image-dtype feature (PNG/JPEG bytes in parquet) as uint8 (C, H, W); ``where`` names it in errors."""
    try:
        with av.open(io.BytesIO(data)) as container:
            frame = next(container.decode(video=0))
    except (av.FFmpegError, StopIteration, IndexError, TypeError, ValueError) as e:
        raise DecodeError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from e
    return torch.from_numpy(np.ascontiguousarray(frame.to_ndarray(format="rgb24").transpose(2, 0, 1)))
