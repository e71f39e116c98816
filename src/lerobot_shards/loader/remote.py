"""Remote reads give up in seconds: connect/read timeouts and bounded retries for object storage.

By default s3fs tries a timed-out request 5 times and botocore tries each of those 5 times,
each waiting out a 15 s read timeout: an unresponsive bucket stalls a reader for about 6-7
minutes before anything is reported. A training job should hear within seconds which shard it could
not read, so the loader sets tighter defaults; any of them can be overridden through
``storage_options`` (the user's values win).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import fsspec

from ..redaction import redact

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


@contextlib.contextmanager
def reading(where: str) -> Iterator[None]:
    """Re-raise a filesystem's transport failures (timeouts, refused connections: botocore, aiohttp
    and asyncio types alike) as one ``OSError`` that says what was being read and what to do.

    Its text is redacted and it is raised ``from None``: botocore's and aiohttp's messages name the
    endpoint, and a chained cause would print them again in every traceback. The package's own
    errors (ValueError subclasses) and missing files already say where and pass.
    """
    try:
        yield
    except (ValueError, LookupError, FileNotFoundError, PermissionError):
        raise
    except Exception as e:
        raise OSError(redact(f"{where}: cannot read it ({type(e).__name__}: {e}); {READ_HINT}")) from None
