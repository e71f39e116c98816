"""The reader thread: loads a consumer's episodes in admission order ahead of the training thread.

Reading a shard is I/O-bound; a background thread keeps up to ``depth`` episodes queued so the
training thread rarely waits. The thread is the only caller of the source's ``read_episode``
and ``prefetch`` while it runs; it does not own the source (whoever opened it closes it, after
``EpisodeReader.close``).

A reader still running when the interpreter exits (a loop left early) is stopped then
(``shutdown``); its consumer's next ``next`` raises ``ReaderClosed`` instead of blocking.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ...exceptions import LeRobotShardsError
from ..transport import shutdown
from .integrity import IntegrityError
from .sources import EpisodeSource, ResidentEpisode

log = logging.getLogger(__name__)


class ReaderClosed(LeRobotShardsError, RuntimeError):
    """The reader was closed under its consumer (at interpreter exit): the stream ends here."""


class HeldBytes:
    """Bytes of the episodes a consumer holds, from the end of their read (the reader thread) to
    their release (the training thread, once their queued samples are decoded): what the memory
    budget bounds (``plan.budget``), its peak counted as ``resident_bytes_peak``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.peak = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.now += nbytes
            self.peak = max(self.peak, self.now)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.now -= nbytes


class EpisodeReader:
    """Reads episodes in admission order on a background thread into a bounded queue.

    Args:
        source: where episodes come from; used only by this reader's thread until ``close``.
        episodes: the consumer's (shard, episode) list in reading order.
        order: (pass, position) keys in admission order (``PoolSampler.admission_order``).
        depth: episodes read ahead at most; on entering a shard the source is told the following
            shards that hold the next ``depth`` episodes (at least the next shard), to fetch ahead.
        skip_bad: an episode whose bytes fail their checksum (``IntegrityError``) is handed over
            as None (logged) instead of ending the stream with the error.
        held: counts each episode's bytes once it is read (its consumer releases them).
    """

    _END = object()

    def __init__(
        self,
        source: EpisodeSource,
        episodes: Sequence[tuple[int, int]],
        order: Iterator[tuple[int, int]],
        depth: int,
        *,
        skip_bad: bool = False,
        held: HeldBytes | None = None,
    ) -> None:
        self.held = held if held is not None else HeldBytes()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._skip_bad = skip_bad
        self._stop = threading.Event()
        self._depth = max(1, depth)
        self._thread = threading.Thread(target=self._run, args=(source, episodes, order), daemon=True)
        self._untrack = shutdown.untrack  # bound now: close may run while modules are torn down
        self._thread.start()
        shutdown.track(self._thread, self._stop.set)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(
        self, source: EpisodeSource, episodes: Sequence[tuple[int, int]], order: Iterator[tuple[int, int]]
    ) -> None:
        try:
            shard_order = list(dict.fromkeys(shard for shard, _ in episodes))
            sizes = collections.Counter(shard for shard, _ in episodes)
            current = None
            for key in order:
                shard, episode_index = episodes[key[1]]
                if shard != current:  # entering a shard: the following ones may be fetched in the background
                    current = shard
                    following, ahead = shard_order.index(shard) + 1, 0
                    while following < len(shard_order) and ahead < self._depth:
                        source.prefetch(shard_order[following])
                        ahead += sizes[shard_order[following]]
                        following += 1
                if not self._put((key, self._read(source, shard, episode_index))):
                    return
            self._put(self._END)
        except BaseException as e:  # handed to the consumer thread, which re-raises it
            self._put(e)

    def _read(self, source: EpisodeSource, shard: int, episode_index: int) -> ResidentEpisode | None:
        try:
            episode = source.read_episode(shard, episode_index)
            self.held.add(episode.nbytes)
            return episode
        except IntegrityError as e:
            if not self._skip_bad:
                raise
            log.warning("skipping episode %d (on_error='skip'): %s", episode_index, e)
            return None

    def next(self) -> tuple[tuple[int, int], ResidentEpisode | None, float]:
        """The next episode: its (pass, position) key, the episode, and seconds spent waiting."""
        start = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():  # closed from another thread (at interpreter exit): never blocks
                    raise ReaderClosed("episode reader closed") from None
        waited = time.perf_counter() - start
        if item is self._END:
            raise RuntimeError("episode reader ended before the sampler: plan and source disagree")
        if isinstance(item, BaseException):
            raise item
        return item[0], item[1], waited

    def close(self) -> None:
        """Stop the thread and wait for it (a read in flight finishes first, up to 5 s)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._untrack(self._thread)
