"""Every remote call gives up in seconds: connect/read timeouts and bounded retries for object storage.

By default s3fs tries a timed-out request 5 times and botocore tries each of those 5 times,
each waiting out a 60 s read timeout: an unresponsive bucket stalls a command for many minutes
before anything is reported. A training job or a conversion should hear within a minute which
file it could not read or write, so every source, destination and CLI command fills in tighter
defaults (``with_timeouts``); any of them can be overridden through ``storage_options`` (the
user's values win), e.g. ``{"config_kwargs": {"read_timeout": 1, "retries": {"max_attempts": 0}}}``
for tests that pause a server on purpose.
"""

from __future__ import annotations

import copy
import io
from typing import Any

import fsspec
import fsspec.asyn
import fsspec.caching
import fsspec.exceptions

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 5.0  # longest silence within one response, not the time to read it
# botocore retries a failed request (timeouts, connection errors, 5xx) once, with its jittered
# backoff; s3fs wraps that in its own 5 attempts with backoff (0.1 s, 0.17 s, ... ; not settable
# per instance). A bucket that stops answering fails after 5 x 2 x READ_TIMEOUT_S = 50 s at most.
BOTOCORE_RETRIES = {"mode": "standard", "max_attempts": 1}
READ_HINT = (
    "check that the storage server is up and reachable (endpoint_url in storage_options, or AWS_ENDPOINT_URL) "
    "and read again"
)
# A checksum the storage client checked (botocore's FlexibleChecksumError): the server answered, the
# bytes are wrong; its reachability is not the problem.
CHECKSUM_HINT = (
    "the bytes the storage sent do not match the checksum it keeps for the object (damaged in storage or in "
    "transit); read again, and if it persists restore or re-upload the object"
)


# Where the transport errors that are not OSErrors come from (botocore's, aiohttp's, ...): only
# these are the storage's fault and get a hint about the storage.
TRANSPORT_MODULES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "fsspec", "urllib3", "requests", "asyncio"}
)


def is_transport_error(error: BaseException) -> bool:
    """Raised by a storage client or its transport (not by us, not a bug or a MemoryError of ours)."""
    return type(error).__module__.split(".")[0] in TRANSPORT_MODULES


def is_checksum_error(error: BaseException) -> bool:
    """A storage client's checksum check that failed (botocore's ``FlexibleChecksumError``, ...), or an
    error of ours whose text quotes one."""
    return any("Checksum" in t.__name__ for t in type(error).__mro__) or "ChecksumError" in str(error)


def read_failure(error: BaseException) -> str:
    """``cannot read it (<type>: <message>); <what to do>``: the hint fits the failure (a checksum
    that failed is the bytes' fault, anything else the connection's)."""
    hint = CHECKSUM_HINT if is_checksum_error(error) else READ_HINT
    return f"cannot read it ({type(error).__name__}: {error}); {hint}"


def with_timeouts(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` for ``url`` with the loader's timeout and retry defaults filled in.

    Only S3 (s3fs) gets defaults; other protocols pass through unchanged. The user's
    ``config_kwargs`` entries win over each default.
    """
    protocol = fsspec.core.split_protocol(str(url))[0]
    if protocol not in ("s3", "s3a"):
        return storage_options
    options = copy.deepcopy(storage_options) if storage_options else {}
    config = options.setdefault("config_kwargs", {})
    config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    config.setdefault("read_timeout", READ_TIMEOUT_S)
    config.setdefault("retries", dict(BOTOCORE_RETRIES))
    return options


S3FS_ATTEMPTS = 5  # s3fs's own tries of each request (its class default; not a storage option)
BACKOFF_SLACK_S = 2.0  # s3fs's waits between its tries add up to ~1.9 s


def call_deadline(fs: Any) -> float | None:
    """The longest one call to ``fs`` may take in all: s3fs's tries x botocore's tries x the
    longer of the connect and read timeouts, plus the waits between tries (52 s with the
    defaults); None for file systems without botocore's timeouts (local disk).

    The bound is needed because some s3fs calls (``cat_file``) wrap their request in a second
    retry loop: 5 x 5 tries of a request to a paused server would take minutes.
    """
    config = getattr(fs, "config_kwargs", None)
    if not isinstance(fs, fsspec.asyn.AsyncFileSystem) or not isinstance(config, dict) or fs.asynchronous:
        return None
    retries = config.get("retries") or {}
    tries = retries.get("total_max_attempts") or 1 + retries.get("max_attempts", 4)
    wait = max(float(config.get("connect_timeout", 60)), float(config.get("read_timeout", 60)))
    return S3FS_ATTEMPTS * tries * wait + BACKOFF_SLACK_S


def bounded(fs: Any, method: str, *args: Any, extra_s: float = 0.0, **kwargs: Any) -> Any:
    """``fs.<method>(*args, **kwargs)``, given up after ``call_deadline(fs)`` (+ ``extra_s``, the time
    a large transfer needs) seconds in all.

    fsspec's blocking wrappers of an async file system take ``timeout=``: past it the call
    raises ``TimeoutError`` (here with the bound in its text) instead of waiting out every retry.
    """
    deadline = call_deadline(fs)
    if deadline is None:
        return getattr(fs, method)(*args, **kwargs)
    deadline += extra_s
    try:
        return getattr(fs, method)(*args, timeout=deadline, **kwargs)
    except fsspec.exceptions.FSTimeoutError:
        target = args[1] if method in ("put_file", "put") and len(args) > 1 else args[0] if args else None
        what = f"{fs.unstrip_protocol(target)}: " if isinstance(target, str) else ""  # the remote object
        raise TimeoutError(f"{what}no answer from the storage within {deadline:.0f} s ({method})") from None


def is_timeout(error: BaseException) -> bool:
    """A timeout of any layer (ours, asyncio, aiohttp, botocore): already retried below, not worth another try."""
    return isinstance(error, TimeoutError) or any("Timeout" in t.__name__ for t in type(error).__mro__)


class BoundedFile(io.RawIOBase):
    """A remote object read like a file, every fetch a ``bounded`` ranged ``cat_file``.

    s3fs's own file objects retry each block read in two nested loops (25 tries of a request to
    a paused server); this one reads through fsspec's block cache with one bounded call per block.
    """

    def __init__(self, fs: Any, path: str, size: int, block_size: int, blocks: int) -> None:
        super().__init__()
        self.fs, self.path, self.size, self.pos = fs, path, size, 0
        self._failed: BaseException | None = None
        self._cache = fsspec.caching.BlockCache(block_size, self._fetch, size, maxblocks=blocks)

    def _fetch(self, start: int, end: int) -> bytes:
        if self._failed is not None:  # a reader (FFmpeg) asking again after a failure gets it at once
            raise self._failed
        try:
            return bytes(bounded(self.fs, "cat_file", self.path, start=start, end=end))
        except Exception as e:
            self._failed = e
            raise

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if self.pos >= end:
            return b""
        data = self._cache._fetch(self.pos, end)
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def open_bounded(fs: Any, path: str, *, block_size: int = 8 * 1024 * 1024, blocks: int = 4) -> Any:
    """A binary file object for reading ``path``: a ``BoundedFile`` on object storage, else ``fs.open``."""
    if call_deadline(fs) is None:
        return fs.open(path, "rb", block_size=block_size)
    return BoundedFile(fs, path, int(bounded(fs, "size", path)), block_size, blocks)
