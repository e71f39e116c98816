"""``EpisodePoolDataset``: stream whole shards into an episode pool, emit random frames, decode at emit.

Each (rank x worker) consumer gets a disjoint, frame-balanced set of whole shards per epoch
(``partition``), replays a deterministic pool order over their episodes (``sampling``), and
turns each emission into a sample shaped like ``LeRobotDataset.__getitem__``. Resume is a
fast-forward of that order on tables alone (``resume``): no episode that was already used up
is read again, and nothing is decoded until a sample is emitted.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..lerobot_v3 import IMAGE_DTYPE
from ..resize import DEFAULT_MODE, resized_features
from .cache import default_cache_bytes
from .control import ResumeState, SharedControl
from .decode import DecodePool, DecoderCache, auto_decode_threads, check_cuda_backend, decode_image, decode_sizes
from .device import rank_device
from .elastic import ElasticPlan, Origin, SubsetSampler, plan_elastic
from .partition import Consumer, ConsumerPlan, PlanOptions, ShardSpec, filter_shards, plan_consumer
from .reader import EpisodeReader
from .remote import with_timeouts
from .resume import resume_point
from .sampling import PoolSampler, consumer_rng
from .sources import ResidentEpisode, open_source
from .stats import SharedStats, StatSlot
from .windows import delta_frame_offsets, window_indices

log = logging.getLogger(__name__)
# The version of the emission order (sampling.py) that resume states record: a state saved under
# another order would replay other samples, so it is refused. 2: pools fill gradually (FILL_EVERY).
SAMPLER_ORDER = 2

ON_ERROR = ("raise", "skip")


class EpisodePoolDataset(IterableDataset):
    """A PyTorch IterableDataset over a converted dataset or a raw LeRobot v3.0 dataset.

    Args:
        source: converted dataset (directory/URL holding ``manifest.json``, or the manifest
            itself) or raw LeRobot v3.0 dataset (directory/URL holding ``meta/info.json``).
        delta_timestamps: ``{key: [seconds, ...]}`` exactly as LeRobot's: windows of frames
            around each sample, clamped to the episode with ``<key>_is_pad`` flags.
        episode_pool_size: episodes resident per consumer; frames are drawn uniformly across them.
        seed, shuffle: randomness of shard assignment, shard order and frame order.
        video_decode_device: ``"cpu"``, ``"cuda"`` (this rank's GPU: ``LOCAL_RANK``) or ``"cuda:N"``
            (NVDEC; DataLoader workers then need ``multiprocessing_context="spawn"``).
        cuda_decode_backend: torchcodec's CUDA backend, ``"nvdec"`` or ``"ffmpeg"``.
        strict_cuda_decode: a clip this GPU cannot decode raises instead of falling back to the
            CPU with one warning (per worker process).
        image_dtype: ``torch.float32`` in [0, 1] like LeRobot, or ``torch.uint8``.
        cameras: subset of camera keys to decode (default all).
        episodes: subset of episode indices (default all).
        tolerance_s: tolerance for ``delta_timestamps`` (LeRobot's default 1e-4 s).
        rank, world_size: default from torch.distributed, else ``RANK``/``WORLD_SIZE``, else 0/1.
        cache_dir: local directory where remote shards (and a raw dataset's mp4s) are downloaded
            whole, shared by every worker and rank on the node (see ``loader.cache``).
        cache_max_bytes: bound on the cache's size; default half of the free space of its
            filesystem, at most 1 TiB (``cache.default_cache_bytes``). Unused files are evicted LRU.
        storage_options: fsspec options for remote sources (e.g. s3 endpoint and keys).
        equal_samples_per_rank: every consumer yields total_frames // consumers samples, so all
            ranks run the same number of batches and DDP never hangs at epoch end; a consumer
            above that count drops its last frames, one below repeats frames. Default (``None``):
            on when world_size > 1 (like DistributedSampler's padding), off for a single rank,
            where every frame is then emitted exactly once.
        drop_last: must match the DataLoader's ``drop_last`` (used by resume bookkeeping).
        shard_bytes, episodes_per_shard: virtual shard plan for raw sources (the converter's).
        decoder_cache_size: decoders kept per consumer (default pool size x cameras, capped at 64).
        num_ffmpeg_threads: decoder threads per clip. 1 is fastest for random access (threaded
            decoders flush on every seek) and keeps many workers from oversubscribing cores.
        prefetch_episodes: episodes read ahead in the background (default the pool size; at least 1).
        on_error: what to do with an episode whose bytes do not match their checksum after one
            re-fetch: ``"raise"`` (default) or ``"skip"`` it (its samples are dropped, logged and
            counted in ``stats()`` as ``episodes_skipped``/``samples_skipped``). In equal-count
            mode (``equal_samples_per_rank``, the DDP default) each dropped sample is replaced by
            another frame of a good resident episode (``samples_substituted``), so every rank
            still yields its count and DDP cannot wait forever at epoch end.
        resize, resize_mode: decode video at (height, width) (or ``{camera: (height, width)}``),
            ``"pad"``/``"crop"``/``"stretch"`` as ``convert --resize`` stores it; for raw datasets
            and full-size shards (shards converted with ``--resize`` are already that size).
        decode_threads: threads decoding video in each consumer (0: in the iterating thread).
            torchcodec releases the GIL while decoding, so threads decode in parallel and overlap
            decoding with collation; the frames of the next ``2 x decode_threads`` samples are
            decoded ahead, and samples keep their order. ``None`` (default) chooses by where the
            dataset is iterated (``auto_decode_threads``): one per core, up to 8, in the main
            process (``num_workers=0``, no inter-process copy of frames), the cores left per worker
            in DataLoader workers (none with more workers than cores), 0 with NVDEC.
    """

    def __init__(
        self,
        source: str,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episode_pool_size: int = 16,
        seed: int = 0,
        shuffle: bool = True,
        video_decode_device: str = "cpu",
        cuda_decode_backend: str = "nvdec",
        strict_cuda_decode: bool = False,
        image_dtype: torch.dtype = torch.float32,
        cameras: Sequence[str] | None = None,
        episodes: Sequence[int] | None = None,
        tolerance_s: float = 1e-4,
        rank: int | None = None,
        world_size: int | None = None,
        cache_dir: str | None = None,
        cache_max_bytes: int | None = None,
        storage_options: dict[str, Any] | None = None,
        equal_samples_per_rank: bool | None = None,
        drop_last: bool = False,
        shard_bytes: int | None = None,
        episodes_per_shard: int | None = None,
        decoder_cache_size: int | None = None,
        num_ffmpeg_threads: int = 1,
        prefetch_episodes: int | None = None,
        resize: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
        resize_mode: str = DEFAULT_MODE,
        decode_threads: int | None = None,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        if not isinstance(episode_pool_size, int) or episode_pool_size < 1:
            raise ValueError(f"episode_pool_size must be an int >= 1, got {episode_pool_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if decoder_cache_size is not None and (not isinstance(decoder_cache_size, int) or decoder_cache_size < 1):
            raise ValueError(
                f"decoder_cache_size must be an int >= 1 (None: pool size x cameras), got {decoder_cache_size!r}"
            )
        if prefetch_episodes is not None and (not isinstance(prefetch_episodes, int) or prefetch_episodes < 1):
            raise ValueError(
                f"prefetch_episodes must be an int >= 1 (None: the pool size); the reader always reads at least "
                f"the next episode ahead, got {prefetch_episodes!r}"
            )
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if not isinstance(num_ffmpeg_threads, int) or num_ffmpeg_threads < 0:
            raise ValueError(
                f"num_ffmpeg_threads must be an int >= 0 (0 = FFmpeg's choice), got {num_ffmpeg_threads!r}"
            )
        if decode_threads is not None and (not isinstance(decode_threads, int) or decode_threads < 0):
            raise ValueError(
                f"decode_threads must be None (automatic) or an int >= 0 (0 = decode inline), got {decode_threads!r}"
            )
        if image_dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"image_dtype must be torch.float32 or torch.uint8, got {image_dtype}")
        video_decode_device = rank_device(video_decode_device, what="video_decode_device")
        check_cuda_backend(cuda_decode_backend)
        self.source_url = str(source)
        storage_options = with_timeouts(self.source_url, storage_options)
        self._open_kwargs: dict[str, Any] = dict(
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_max_bytes=default_cache_bytes(cache_dir)
            if cache_dir and cache_max_bytes is None
            else cache_max_bytes,
            shard_bytes=shard_bytes,
            episodes_per_shard=episodes_per_shard,
            episodes=None if episodes is None else tuple(int(e) for e in episodes),
        )
        meta = open_source(self.source_url, **self._open_kwargs)  # for its metadata only
        meta.close()
        info = meta.info
        self.fps = info.fps
        self.features = info.features
        self.tasks = info.tasks
        if cameras is None:
            cameras = info.cameras
        unknown = sorted(set(cameras) - set(info.cameras))
        if unknown:
            raise ValueError(f"{self.source_url}: unknown cameras {unknown}; the dataset has {list(info.cameras)}")
        self.cameras = tuple(cameras)
        self.resize_mode = resize_mode
        self.resize_sizes = decode_sizes(resize, resize_mode, self.cameras)
        self.features = resized_features(self.features, self.resize_sizes)
        self.image_keys = tuple(k for k, v in self.features.items() if v["dtype"] == IMAGE_DTYPE)
        known = [k for k, v in self.features.items() if v["dtype"] != "video"] + list(self.cameras)
        self.delta_offsets = delta_frame_offsets(delta_timestamps or {}, self.fps, tolerance_s, known_keys=known)
        self.shards = self._select_shards(info.shards, episodes)
        self.episode_pool_size = episode_pool_size
        self.seed = int(seed)
        self.on_error = on_error
        self.shuffle = shuffle
        self.video_decode_device = video_decode_device
        self.cuda_decode_backend = cuda_decode_backend
        self.strict_cuda_decode = strict_cuda_decode
        self.feature_stats = info.stats  # meta/stats.json, e.g. for DeviceFeeder(normalize=...)
        self.image_dtype = image_dtype
        self.drop_last = drop_last
        self.storage_options = storage_options
        if decoder_cache_size is None:
            decoder_cache_size = min(64, episode_pool_size * max(1, len(self.cameras)))
        self.decoder_cache_size = decoder_cache_size
        self.num_ffmpeg_threads = num_ffmpeg_threads
        self.prefetch_episodes = episode_pool_size if prefetch_episodes is None else prefetch_episodes
        self.decode_threads = decode_threads
        self.rank, self.world_size = _distributed(rank, world_size)
        # DDP-safe default: unequal batch counts across ranks hang the first collective after
        # the shorter rank's epoch ended.
        self.equal_samples_per_rank = self.world_size > 1 if equal_samples_per_rank is None else equal_samples_per_rank
        self._control = SharedControl()  # epoch and resume state, read by (persistent) workers
        self._stats = SharedStats()

    # -- configuration --------------------------------------------------------------------------

    def _select_shards(self, shards: list[ShardSpec], episodes: Sequence[int] | None) -> list[ShardSpec]:
        if episodes is None:
            return list(shards)
        wanted = set(int(e) for e in episodes)
        missing = sorted(wanted.difference(*(s.episodes for s in shards)))
        if missing:
            raise ValueError(f"{self.source_url}: episodes {missing[:10]} are not in the dataset")
        return filter_shards(shards, wanted)

    @property
    def epoch(self) -> int:
        """The epoch the next iterator plans for (shared with persistent workers)."""
        return self._control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``; call before each epoch's iterator, like DistributedSampler.

        Works with ``persistent_workers=True`` too: workers read the epoch at every ``__iter__``.
        """
        self._control.epoch = int(epoch)

    def state_dict(self, batches_consumed: int, batch_size: int) -> dict[str, int]:
        """The resume state, built by the training loop from the batches it has consumed.

        ``seed``, ``world_size`` and the DataLoader's ``num_workers`` (as the workers reported
        it; absent before the first iteration) ride along so that resuming under other
        settings fails loudly instead of replaying a different order.
        """
        state = {
            "epoch": self.epoch,
            "batches_consumed": int(batches_consumed),
            "batch_size": int(batch_size),
            "seed": self.seed,
            "world_size": self.world_size,
            "episode_pool_size": self.episode_pool_size,
            "sampler_order": SAMPLER_ORDER,
        }
        seen = self._control.seen_workers
        if seen is not None:
            state["num_workers"] = seen
            resume = self._control.resume
            if resume is not None and resume.epoch == self.epoch:
                origin, _ = _elastic_origin(resume, self.world_size, seen)
                if origin is not None:  # this epoch is elastic: a later resume must rebuild it
                    state.update({f"elastic_{k}": v for k, v in vars(origin).items()})
        return state

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next iterator of ``state['epoch']`` starts after ``batches_consumed`` batches."""
        missing = {"epoch", "batches_consumed", "batch_size"} - set(state)
        if missing:
            raise ValueError(f"resume state lacks {sorted(missing)}: {dict(state)}")
        # Another world size is resumed elastically, which needs the saved worker count.
        same = {"seed": self.seed, "episode_pool_size": self.episode_pool_size, "sampler_order": SAMPLER_ORDER}
        if "num_workers" not in state:
            same["world_size"] = self.world_size
        for key, value in same.items():
            if key in state and int(state[key]) != value:
                raise ValueError(
                    f"resume state was saved with {key}={state[key]} but this dataset has {key}={value}: "
                    f"the sample order would differ"
                    + (
                        " (a state saved by another lerobot-shards version: finish its epoch with that version, "
                        "or start the next epoch here)"
                        if key == "sampler_order"
                        else ""
                    )
                )
        self._control.epoch = int(state["epoch"])
        workers, world = state.get("num_workers"), state.get("world_size")
        fields = [f"elastic_{k}" for k in Origin.__dataclass_fields__]
        self._control.resume = ResumeState(
            epoch=int(state["epoch"]),
            batches_consumed=int(state["batches_consumed"]),
            batch_size=int(state["batch_size"]),
            num_workers=None if workers is None else int(workers),
            world_size=None if world is None else int(world),
            origin=Origin(*(int(state[f]) for f in fields)) if all(f in state for f in fields) else None,
        )

    # -- planning (pure) ------------------------------------------------------------------------

    @property
    def plan_options(self) -> PlanOptions:
        """The settings that shape every consumer's plan."""
        return PlanOptions(shuffle=self.shuffle, equal_samples_per_rank=self.equal_samples_per_rank)

    def plan(self, rank: int, worker: int, num_workers: int) -> ConsumerPlan:
        """The consumer's episodes and sample counts for the current epoch; no I/O.

        Warns (once per rank, from worker 0) about idle or unbalanced consumers.
        """
        plan = self._plan(rank, worker, num_workers)
        if rank == 0 and worker == 0:
            for message in plan.warnings:
                warnings.warn(message, stacklevel=2)
        return plan

    def epoch_samples(self, num_workers: int) -> int:
        """Samples this rank yields this epoch with ``num_workers`` DataLoader workers."""
        return sum(self._plan(self.rank, 0, num_workers).rank_samples)

    def _plan(self, rank: int, worker: int, num_workers: int) -> ConsumerPlan:
        consumer = Consumer(rank, self.world_size, worker, max(1, num_workers))  # num_workers=0: one consumer
        return plan_consumer(
            self.shards, seed=self.seed, epoch=self.epoch, consumer=consumer, options=self.plan_options
        )

    def _plan_elastic(self, origin: Origin, worker: int, num_workers: int) -> ElasticPlan:
        consumer = Consumer(self.rank, self.world_size, worker, max(1, num_workers))
        return plan_elastic(
            self.shards,
            seed=self.seed,
            epoch=self.epoch,
            options=self.plan_options,
            pool_size=self.episode_pool_size,
            origin=origin,
            drop_last=self.drop_last,
            consumer=consumer,
        )

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (0, 0) if info is None else (info.id, info.num_workers)
        stats = self._stats.slot(worker)
        # A resumed epoch may hand this DataLoader worker another worker's stream: the DataLoader
        # restarts its round-robin at worker 0, the interrupted run was mid-round.
        self._control.saw_workers(num_workers)
        stream, skip = worker, 0
        plan: ConsumerPlan | None = None
        sampler: PoolSampler | SubsetSampler | None = None
        resume = self._control.resume
        if resume is not None and resume.epoch == self.epoch:
            origin, batches = _elastic_origin(resume, self.world_size, num_workers)
            if origin is None:
                counts = self._plan(self.rank, worker, num_workers).rank_samples
                stream, skip = resume_point(batches, resume.batch_size, counts, worker, self.drop_last)
            else:
                elastic = self._plan_elastic(origin, stream, num_workers)
                plan = elastic.plan
                counts = plan.rank_samples
                if batches:
                    stream, skip = resume_point(batches, resume.batch_size, counts, worker, self.drop_last)
                    elastic = self._plan_elastic(origin, stream, num_workers)
                    plan = elastic.plan
                sampler = SubsetSampler(
                    elastic, self.episode_pool_size, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle
                )
        if sampler is None:
            plan = self.plan(self.rank, stream, num_workers)
            sampler = PoolSampler(
                plan.lengths,
                self.episode_pool_size,
                consumer_rng(self.seed, self.epoch, self.rank, stream),
                shuffle=self.shuffle,
                num_samples=plan.num_samples,
            )
        assert plan is not None
        stats.reset()
        start = time.perf_counter()
        sampler.skip(skip)
        stats.add("fast_forward_samples", skip)
        stats.add("fast_forward_seconds", time.perf_counter() - start)
        return self._stream(plan, sampler, skip, stats)

    def _stream(
        self, plan: ConsumerPlan, sampler: PoolSampler | SubsetSampler, emitted: int, stats: StatSlot
    ) -> Iterator[dict[str, Any]]:
        per_pass = sum(plan.lengths)
        if sampler.num_samples == emitted:
            return
        # This iteration's own source (never shared with another iterator or process): its
        # reader thread is the only one reading it, and it is closed here once that thread stopped.
        source = open_source(self.source_url, **self._open_kwargs)
        reader = EpisodeReader(
            source, plan.episodes, sampler.admission_order(), self.prefetch_episodes, skip_bad=self.on_error == "skip"
        )
        threads = self.decode_threads
        if threads is None:
            threads = auto_decode_threads(self.video_decode_device)
        stats.set("decode_threads", threads)
        decoders = DecodePool(
            threads,
            lambda: DecoderCache(
                -(-self.decoder_cache_size // max(1, threads)),  # clips are spread over the threads
                device=self.video_decode_device,
                num_ffmpeg_threads=self.num_ffmpeg_threads,
                storage_options=self.storage_options,
                cuda_backend=self.cuda_decode_backend,
                strict_cuda=self.strict_cuda_decode,
                resize_mode=self.resize_mode,
            ),
        )
        pool: dict[tuple[int, int], ResidentEpisode | None] = {}  # None: skipped (on_error="skip")
        pending: deque[dict[str, Any]] = deque()  # samples whose frames are being decoded, in order
        lookahead = 2 * threads
        releases: deque[tuple[int, Callable[[], None]]] = deque()  # (samples queued before it, release)
        queued = done = 0
        owed = 0  # skipped samples not yet replaced (equal-count mode)
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
                    stats.add("wait_seconds", waited)
                episode = pool[key]
                picks = [] if episode is None else [(episode, emission.frame)]
                if episode is None:  # its bytes were bad: its samples are dropped, never wrong
                    stats.add("samples_skipped", 1)
                    if emission.last:
                        del pool[key]
                    owed += self.equal_samples_per_rank
                if owed:  # equal-count mode: repeat frames of a good resident episode instead
                    good = episode if episode is not None else next((e for e in pool.values() if e is not None), None)
                    if good is not None:
                        picks += [(good, (emission.frame + 1 + i) % good.length) for i in range(owed)]
                        stats.add("samples_substituted", owed)
                        owed = 0
                for chosen, frame in picks:
                    pending.append(self._sample(chosen, frame, decoders))
                    queued += 1
                if episode is None:
                    continue
                if emission.last:
                    del pool[key]
                    stats.add("evictions", 1)
                    for clip in episode.clips.values():
                        if clip.data is not None:
                            decoders.drop(clip.cache_key)
                    if episode.release is not None:  # its cached mp4s, once its queued samples are decoded
                        releases.append((queued, episode.release))
                stats.set("pool_occupancy", len(pool))
                while len(pending) > lookahead:
                    yield self._emit(pending.popleft(), decoders, stats)
                    done += 1
                    while releases and releases[0][0] <= done:
                        releases.popleft()[1]()
                for name, value in source.io_stats().items():
                    stats.set(name, value)
            while pending:
                yield self._emit(pending.popleft(), decoders, stats)
            if owed:
                log.warning(
                    "on_error='skip': %d skipped sample(s) found no good episode to repeat; this consumer "
                    "yielded fewer samples than the other ranks expect (DDP may wait at epoch end)",
                    owed,
                )
            for name, value in source.io_stats().items():
                stats.set(name, value)
        finally:
            reader.close()
            source.close()
            decoders.close()

    @staticmethod
    def _emit(item: dict[str, Any], decoders: DecodePool, stats: StatSlot) -> dict[str, Any]:
        """The sample with its decoded frames in place of their futures."""
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
        return item

    def _sample(self, episode: ResidentEpisode, frame: int, decoders: DecodePool) -> dict[str, Any]:
        """One sample; its camera frames are futures (``DecodePool``) until ``_emit``."""
        item: dict[str, Any] = {}
        for name, column in episode.columns.items():
            offsets = self.delta_offsets.get(name)
            idx, pad = (frame, None) if offsets is None else window_indices(frame, episode.length, offsets)
            if name in self.image_keys:
                at = f"{self.source_url}: episode {episode.episode_index} feature {name} frame"
                frames = [decode_image(column[i], f"{at} {int(i)}") for i in np.atleast_1d(idx)]
                value = self._images(torch.stack(frames))
                item[name] = value if pad is not None else value[0]
            else:
                item[name] = torch.tensor(column[idx])
            if pad is not None:
                item[f"{name}_is_pad"] = torch.from_numpy(pad)
        for cam in self.cameras:
            offsets = self.delta_offsets.get(cam)
            size = self.resize_sizes.get(cam)
            if offsets is None:
                item[cam] = decoders.submit(episode.clips[cam], [frame], size, lambda f: self._images(f)[0])
            else:
                idx, pad = window_indices(frame, episode.length, offsets)
                item[cam] = decoders.submit(episode.clips[cam], idx.tolist(), size, self._images)
                item[f"{cam}_is_pad"] = torch.from_numpy(pad)
        item["task"] = self.tasks[int(episode.columns["task_index"][frame])]
        return item

    def _images(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.float().div_(255) if self.image_dtype == torch.float32 else frames

    # -- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Per-worker and total counters of the last iteration in this process tree (this rank)."""
        return {"rank": self.rank, **self._stats.summary()}


def _elastic_origin(resume: ResumeState, world_size: int, num_workers: int) -> tuple[Origin | None, int]:
    """The run to finish the epoch of elastically (``None``: resume as is) and batches since.

    A state saved under another layout starts an elastic epoch. A state saved inside an
    elastic-resumed epoch carries that epoch's origin: it resumes under the same layout as the
    run that saved it (its batches after the origin's are skipped on the elastic plan), never
    under a third one.
    """
    same = resume.world_size in (None, world_size) and (
        resume.num_workers is None or max(1, resume.num_workers) == max(1, num_workers)
    )
    if resume.origin is not None:
        if not same:
            raise ValueError(
                f"resume state was saved inside an epoch that was itself resumed under another layout, with "
                f"world_size={resume.world_size} and num_workers={resume.num_workers}; this run has "
                f"world_size={world_size} and num_workers={num_workers}: resume this epoch with the saving run's "
                f"layout (or from a checkpoint at an epoch boundary)"
            )
        return resume.origin, resume.batches_consumed - resume.origin.batches_consumed
    if same or resume.num_workers is None:
        _check_same_workers(resume, num_workers)
        return None, resume.batches_consumed
    origin = Origin(resume.world_size or world_size, resume.num_workers, resume.batches_consumed, resume.batch_size)
    return origin, 0


def _check_same_workers(resume: ResumeState, num_workers: int) -> None:
    """Refuse a resume under another worker count: each worker's stream and skip would differ.

    num_workers 0 and 1 both make one stream per rank, so they may stand for each other.
    """
    if resume.num_workers is not None and max(1, resume.num_workers) != max(1, num_workers):
        raise ValueError(
            f"resume state was saved with DataLoader num_workers={resume.num_workers} but this DataLoader has "
            f"num_workers={num_workers}: the streams would differ (frames repeated and lost); resume with "
            f"num_workers={resume.num_workers}"
        )


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        r, w = rank, world_size
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is not in [0, world_size={w})")
    return r, w
