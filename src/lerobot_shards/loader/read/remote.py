"""Remote reads give up in seconds, and say which file they could not read (``reading``); the
readers of one file by byte range (``LocalFile``, ``RemoteFile`` ahead of the reader, the node
cache's ``CachedFile``) and one consumer's remote reading kit (``RemoteIO``).

The timeout and retry defaults themselves live in ``lerobot_shards.timeouts`` (every command
and source applies them); they are re-exported here for the loader.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, Protocol

from ...exceptions import LeRobotShardsError
from ...redaction import redact
from ...timeouts import (
    BOTOCORE_RETRIES,
    CONNECT_TIMEOUT_S,
    READ_HINT,
    READ_TIMEOUT_S,
    bounded,
    is_transport_error,
    read_failure,
    with_timeouts,
)
from ..options import ReadOptions
from .shard_cache import CHUNK_BYTES, LOCAL_HINTS, FileCache, IOCounters, chunk_range, default_cache_bytes

READ_AHEAD_CHUNKS = 4  # without a cache: chunks requested ahead of the reader
FETCH_THREADS = 4  # ranged requests in flight per consumer

__all__ = ["BOTOCORE_RETRIES", "CONNECT_TIMEOUT_S", "READ_HINT", "READ_TIMEOUT_S", "reading", "with_timeouts"]


@contextlib.contextmanager
def reading(where: str) -> Iterator[None]:
    """Re-raise a filesystem's transport failures (timeouts, refused connections: botocore, aiohttp
    and asyncio types alike) as one ``OSError`` that says what was being read and what to do.

    Its text is redacted and it is raised ``from None``: botocore's and aiohttp's messages name the
    endpoint, and a chained cause would print them again in every traceback. The package's own
    errors and missing files already say where and pass, and so does anything not raised by a
    transport library (a MemoryError or a bug is not a reason to check the server).
    """
    try:
        yield
    except (ValueError, LookupError, FileNotFoundError, PermissionError, LeRobotShardsError) as e:
        _redact_in_place(e)  # they pass, but without the password of a URL they quote
        raise  # they say where already (a Hub source's errors say what to do too)
    except OSError as e:
        if e.errno in LOCAL_HINTS:  # the local disk's problem (the cache's), not the storage server's
            path = f" ({e.filename})" if e.filename else ""
            raise OSError(e.errno, redact(f"{where}: {e.strerror}{path}; {LOCAL_HINTS[e.errno]}")) from None
        raise OSError(redact(f"{where}: {read_failure(e)}")) from None
    except Exception as e:
        if isinstance(e, LeRobotShardsError) or not is_transport_error(e):
            raise  # our own check, or a bug or MemoryError: the storage server is not the reason
        raise OSError(redact(f"{where}: {read_failure(e)}")) from None


def _redact_in_place(error: BaseException) -> None:
    """``error``'s text redacted (its args, an OSError's filenames): the type and traceback stay."""
    if isinstance(error, LeRobotShardsError):
        return  # redacted whenever shown
    if isinstance(error, OSError) and (error.filename is not None or error.strerror is not None):
        error.strerror = redact(error.strerror) if isinstance(error.strerror, str) else error.strerror
        error.filename = redact(error.filename) if isinstance(error.filename, str) else error.filename
        return
    error.args = tuple(redact(a) if isinstance(a, str) else a for a in error.args)


class RemoteFile:
    """Without a cache: a remote file read in large ranged requests, in parallel, ahead of the reader.

    Reads are served from ``CHUNK_BYTES`` chunks; once a read's own chunks have landed it requests
    the next ``ahead`` chunks in the background (never before: on a capped link, read-ahead in
    flight would share the bandwidth with the bytes the reader waits for, and the first batch
    would wait for ``ahead`` chunks instead of one), and drops the chunks before it, so memory
    stays at a few chunks per file.
    """

    def __init__(
        self,
        fetch: Callable[[int, int], bytes],
        size: int,
        pool: ThreadPoolExecutor,
        counters: IOCounters,
        chunk: int = CHUNK_BYTES,
        ahead: int = READ_AHEAD_CHUNKS,
    ) -> None:
        self._fetch = fetch
        self.size = size
        self._pool = pool
        self._counters = counters
        self._chunk = chunk
        self._ahead = ahead
        self._parts: dict[int, Future[bytes]] = {}
        self._lock = threading.Lock()

    def _part(self, i: int) -> bytes:
        data = self._fetch(i * self._chunk, min(self.size, (i + 1) * self._chunk))
        self._counters.add("storage_bytes", len(data))
        return data

    def _request(self, first: int, last: int) -> None:
        with self._lock:
            for i in range(first, min(last, -(-self.size // self._chunk))):
                if i not in self._parts:
                    self._parts[i] = self._pool.submit(self._part, i)

    def start(self) -> None:
        """Request the first chunk (the file is read next; read-ahead follows the first read)."""
        self._request(0, 1)

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) (fewer if the file is shorter)."""
        span = chunk_range(start, min(end, self.size), self._chunk)
        self._request(span.start, span.stop)
        with self._lock:
            for i in [i for i in self._parts if i < span.start]:
                self._parts.pop(i).cancel()
            parts = [self._parts.get(i) for i in span]
        data = b"".join(p.result() for p in parts if p is not None)
        self._request(span.stop, span.stop + self._ahead)
        offset = start - span.start * self._chunk
        return data[offset : offset + end - start]

    def requested(self) -> list[Future[bytes]]:
        """The chunks requested so far and not yet dropped (for ``settled``)."""
        with self._lock:
            return list(self._parts.values())

    def close(self) -> None:
        with self._lock:
            for p in self._parts.values():
                p.cancel()
            self._parts.clear()


def settled(parts: list[Future[Any]]) -> None:
    """Wait until each of ``parts`` has landed, failed or been cancelled. Not ``wait()``: a future
    cancelled while queued (a closed reader, a pool shut down) would never wake it."""
    for part in parts:
        with contextlib.suppress(CancelledError):
            part.exception()


class LocalFile:
    """A file on local disk, read by byte range (the same interface as the remote readers)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, start: int, end: int) -> bytes:
        return os.pread(self._fd, end - start, start)

    def close(self) -> None:
        os.close(self._fd)


def ranged(fs: Any, path: str, where: str) -> Callable[[int, int], bytes]:
    """``fetch(start, end)`` of one remote object: a single ranged request; a failure names ``where``
    (redacted, without the storage's exception chained: its text names the endpoint)."""

    def fetch(start: int, end: int) -> bytes:
        try:
            return bounded(fs, "cat_file", path, start=start, end=end)
        except Exception as e:
            raise OSError(
                redact(f"{where}: reading bytes {start}..{end} from storage failed ({type(e).__name__}: {e})")
            ) from None

    return fetch


class Reader(Protocol):
    """A file read by byte range: ``LocalFile``, ``CachedFile`` or ``RemoteFile``."""

    def read(self, start: int, end: int) -> bytes: ...

    def close(self) -> None: ...


def close_when_open(opening: Future[Any]) -> None:
    """Close a reader that is being opened in the background, once it is (nothing if opening failed)."""

    def close(f: Future[Any]) -> None:
        if not f.cancelled() and f.exception() is None and f.result() is not None:
            f.result().close()

    opening.add_done_callback(close)


class RemoteIO:
    """One consumer's remote reading kit for one dataset: fetch threads, the node cache (if any), counters.

    ``prefix`` is the dataset's directory in the cache (a hash of its URL), so two datasets never
    share names while every consumer of the same dataset shares its files.
    """

    def __init__(self, url: str, read: ReadOptions, counters: IOCounters) -> None:
        self.counters = counters
        self.pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="shard-prefetch")
        self.prefix = hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]
        self.cache = None
        if read.cache_dir is not None:
            max_bytes = default_cache_bytes(read.cache_dir) if read.cache_max_bytes is None else read.cache_max_bytes
            self.cache = FileCache(read.cache_dir, max_bytes, self.pool, counters)

    def close(self, wait: bool = False) -> None:
        """Stop the fetch threads: queued requests are cancelled, those in flight finish (awaited
        with ``wait``, so that no thread is left running)."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
