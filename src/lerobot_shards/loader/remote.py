"""Remote reads give up in seconds, and say which file they could not read (``reading``).

The timeout and retry defaults themselves live in ``lerobot_shards.timeouts`` (every command
and source applies them); they are re-exported here for the loader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..redaction import redact
from ..timeouts import BOTOCORE_RETRIES, CONNECT_TIMEOUT_S, READ_HINT, READ_TIMEOUT_S, with_timeouts

__all__ = ["BOTOCORE_RETRIES", "CONNECT_TIMEOUT_S", "READ_HINT", "READ_TIMEOUT_S", "reading", "with_timeouts"]


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
