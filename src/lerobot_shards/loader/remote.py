"""Remote reads give up in seconds, and say which file they could not read (``reading``).

The timeout and retry defaults themselves live in ``lerobot_shards.timeouts`` (every command
and source applies them); they are re-exported here for the loader.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from ..exceptions import LeRobotShardsError
from ..redaction import redact
from ..timeouts import BOTOCORE_RETRIES, CONNECT_TIMEOUT_S, READ_HINT, READ_TIMEOUT_S, with_timeouts

# Errors of the local disk (the node cache): a hint about the storage server would mislead.
LOCAL_HINTS = {
    errno.ENOSPC: "the disk of cache_dir is full; free space, lower cache_max_bytes or choose another cache_dir",
    errno.EDQUOT: "the disk quota of cache_dir is exceeded; free space or choose another cache_dir",
    errno.EROFS: "cache_dir is on a read-only file system; choose a writable cache_dir",
    errno.EISDIR: "a directory stands where the cache keeps a file; remove it from cache_dir",
    errno.ENOTDIR: "a file stands where the cache keeps a folder; remove it from cache_dir",
    errno.EEXIST: "a file stands where the cache keeps a folder; remove it from cache_dir",
    errno.EACCES: "permission denied in cache_dir; fix its permissions or choose another cache_dir",
}

# Where the transport errors that are not OSErrors come from (botocore's, aiohttp's, ...): only
# these are the storage's fault and get the hint to check the server.
TRANSPORT_MODULES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "fsspec", "urllib3", "requests", "asyncio"}
)

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
    except (ValueError, LookupError, FileNotFoundError, PermissionError) as e:
        _redact_in_place(e)  # they pass, but without the password of a URL they quote
        raise
    except OSError as e:
        if e.errno in LOCAL_HINTS:  # the local disk's problem (the cache's), not the storage server's
            path = f" ({e.filename})" if e.filename else ""
            raise OSError(e.errno, redact(f"{where}: {e.strerror}{path}; {LOCAL_HINTS[e.errno]}")) from None
        raise OSError(redact(f"{where}: cannot read it ({type(e).__name__}: {e}); {READ_HINT}")) from None
    except Exception as e:
        if isinstance(e, LeRobotShardsError) or type(e).__module__.split(".")[0] not in TRANSPORT_MODULES:
            raise  # our own check, or a bug or MemoryError: the storage server is not the reason
        raise OSError(redact(f"{where}: cannot read it ({type(e).__name__}: {e}); {READ_HINT}")) from None


def _redact_in_place(error: BaseException) -> None:
    """``error``'s text redacted (its args, an OSError's filenames): the type and traceback stay."""
    if isinstance(error, LeRobotShardsError):
        return  # redacted whenever shown
    if isinstance(error, OSError) and (error.filename is not None or error.strerror is not None):
        error.strerror = redact(error.strerror) if isinstance(error.strerror, str) else error.strerror
        error.filename = redact(error.filename) if isinstance(error.filename, str) else error.filename
        return
    error.args = tuple(redact(a) if isinstance(a, str) else a for a in error.args)
