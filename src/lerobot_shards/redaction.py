"""Redaction: exceptions turned into one line a user can act on, credentials and endpoints kept out of logs.

The CLI prints ``explain(exc)`` (the path, what went wrong, what to do) instead of a traceback;
``-vv`` adds the traceback through logging, whose formatter redacts access key ids, secrets,
session tokens and request signatures (botocore logs them at debug level), and the storage
endpoint: a private server's address is no business of whoever reads a log or an error
(botocore and aiohttp put it in every connection error). Object-store exceptions are recognised
by their attributes, not imported: s3fs is an optional dependency.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
# Environment variables whose values are secrets wherever they show up in a log line.
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HF_TOKEN")
# Environment variables and the storage option (also inside client_kwargs) naming the endpoint
# URL (boto3, s3fs, fsspec), replaced by ENDPOINT wherever it shows up.
ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "FSSPEC_S3_ENDPOINT_URL", "HF_ENDPOINT")
ENDPOINT_OPTION = "endpoint_url"
ENDPOINT = "<endpoint>"
# Storage-option names whose values are secrets (s3fs, gcsfs, adlfs, generic fsspec).
_SECRET_OPTION = re.compile(r"(key|secret|token|password|credential|sas|signature)", re.IGNORECASE)
# Request-signing material as botocore and presigned URLs print it.
_PATTERNS = [
    re.compile(r"(Credential=)[^,\s'\"&]+"),
    re.compile(r"(Signature=)[^,\s'\"&]+"),
    re.compile(r"(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s'\"]+", re.IGNORECASE),
    re.compile(r"((?:x-amz-security-token|authorization)'?\"?\s*[:=]\s*b?['\"])[^'\"]+", re.IGNORECASE),
    re.compile(r"(Signature:\s*)[0-9a-fA-F]{16,}"),
    re.compile(  # storage options printed as a dict (lower case: 'Key' is an S3 object key)
        r"(\b(?:aws_access_key_id|aws_secret_access_key|aws_session_token|secret|key|token|password)['\"]?\s*[:=]\s*"
        r"['\"])[^'\"]+"
    ),
]
# Hugging Face user access tokens, wherever they show up (the Hub client logs request headers at DEBUG).
_PATTERNS.append(re.compile(r"(?<![A-Za-z0-9_])()hf_[A-Za-z0-9]{20,}"))
# Credentials inside a URL (http://user:token@host/...): whatever the URL, never printed.
_PATTERNS.append(re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/@\s'\"]+(?=@)", re.IGNORECASE))
# Loggers of storage clients that print credentials, signatures and endpoints at DEBUG.
NOISY_LOGGERS = ("botocore", "aiobotocore", "s3fs", "urllib3", "aiohttp")
_secrets: set[str] = set()
_endpoints: set[str] = set()


def without_credentials(url: str) -> str:
    """``url`` without the user and password of its authority (``http://user:token@host/x`` ->
    ``http://host/x``), for anything stored or printed; the password is registered as a secret so
    that a message quoting the original URL is redacted too. Other text passes unchanged."""
    text = str(url)
    if "://" not in text:
        return text
    parts = urllib.parse.urlsplit(text)
    if "@" not in parts.netloc:
        return text
    userinfo, host = parts.netloc.rsplit("@", 1)
    for secret in (userinfo, *userinfo.split(":", 1)[1:]):
        if len(secret) >= 4:
            _secrets.add(urllib.parse.unquote(secret))
            _secrets.add(secret)
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def quiet_storage_loggers(level: int = logging.WARNING) -> None:
    """Keep the storage clients' own loggers (``NOISY_LOGGERS``) at ``level`` or above: at DEBUG,
    botocore logs request headers with the access key id, the session token and the endpoint.
    The CLI calls this whenever it configures logging; a training script that logs at DEBUG should
    call it too (or ``logging.getLogger("botocore").setLevel(logging.WARNING)``)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.getLogger(name).level))


def register_secrets(options: Mapping[str, Any] | None) -> None:
    """Remember the secret values and endpoint URLs of storage options (nested too) so logs and
    errors never show them. Every process that opens storage calls it (spawned workers too)."""
    for name, value in (options or {}).items():
        if isinstance(value, Mapping):
            register_secrets(value)
        elif isinstance(value, str) and name == ENDPOINT_OPTION and value:
            _endpoints.add(value)
        elif isinstance(value, str) and len(value) >= 4 and _SECRET_OPTION.search(str(name)):
            _secrets.add(value)


def split_secrets(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Storage options (nested too) in two: without their secret values, and those alone, for
    options that are stored (a training checkpoint) while their secrets never are."""
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, Mapping):
            public[name], inner = split_secrets(value)
            if inner:
                secret[name] = inner
        elif _SECRET_OPTION.search(str(name)) and not isinstance(value, bool):
            secret[name] = value
        else:
            public[name] = value
    return public, secret


@functools.lru_cache(maxsize=64)  # redact runs on every log line
def _endpoint_patterns(url: str) -> tuple[re.Pattern[str], ...]:
    """The endpoint URL, its bare ``host:port`` and ``('host', port)`` as socket errors print it;
    never inside a longer host name or port number."""
    url = url.strip().rstrip("/")
    m = re.match(r"^(?:[a-z0-9+.-]+://)?(?:[^/@]*@)?(\[[^\]]+\]|[^/:?#\[@]+)(?::(\d+))?", url, re.IGNORECASE)
    if not m:
        return ()
    host, port = re.escape(m.group(1)), m.group(2)
    patterns = [re.escape(url) + r"(?!\d)"]
    if port:
        patterns += [rf"(?<![\w.-]){host}:{port}(?!\d)", rf"['\"]{host}['\"],\s*{port}(?!\d)"]
    elif "." in m.group(1) or ":" in m.group(1):  # a bare one-word host ("minio") is also an ordinary word
        patterns.append(rf"(?<![\w.-]){host}(?![\w-]|\.\w)")
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


def redact(text: str) -> str:
    """``text`` with storage endpoints replaced by ``<endpoint>``, credentials and signatures by ``***``."""
    endpoints = _endpoints | {v for k in ENDPOINT_ENV if (v := os.environ.get(k, "").strip())}
    for url in sorted(endpoints, key=len, reverse=True):
        for pattern in _endpoint_patterns(url):
            text = pattern.sub(ENDPOINT, text)
    values = _secrets | {v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= 4}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class RedactingFormatter(logging.Formatter):
    """A formatter whose whole output, traceback included, goes through ``redact``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _matching(urls: Iterable[str | None], needle: str) -> str | None:
    """The first user URL that mentions ``needle`` (a bucket, a request URL's path)."""
    for url in urls:
        if url and needle and needle in url:
            return url
    return None


_ERRNO_HINTS = {
    errno.ENOSPC: "no space left on the device; free space or choose a destination with more room",
    errno.EDQUOT: "disk quota exceeded; free space or choose another destination",
    errno.EROFS: "the file system is read-only; choose a writable destination",
    errno.EACCES: "permission denied; fix the permissions or choose another destination",
    errno.EPERM: "operation not permitted; fix the permissions or choose another destination",
    errno.ENOENT: "no such file or directory; check the path",
    errno.ENOTDIR: "a parent of this path is not a directory; check the path",
    errno.EISDIR: "is a directory where a file was expected; check the path",
}


def explain(exc: BaseException, urls: Iterable[str | None] = ()) -> str:
    """One line for ``exc``: where, what went wrong and what to do; credentials and endpoints redacted.

    ``urls`` are the locations the command was given (source, destination), used to say which
    of them an object-store error concerns when the exception itself does not.
    """
    return redact(_explain(exc, urls))


def _named(exc: BaseException) -> str | None:
    """The remote object an error of ours names first (``s3://b/ds/shards/x.tar: failed after ...``):
    a storage error chained under it knows no object, and the command's first location may be a
    local folder (upload's)."""
    from .exceptions import LeRobotShardsError

    head = str(exc).split(": ", 1)[0] if isinstance(exc, LeRobotShardsError) else ""
    return head if "://" in head and " " not in head else None


def _explain(exc: BaseException, urls: Iterable[str | None]) -> str:
    named = _named(exc)
    given = [u for u in urls if u]
    from .exceptions import LeRobotShardsError  # late: redaction imports nothing of ours at load

    if named is not None:  # the object our error names goes first: said before the command's locations
        given.insert(0, named)
    for e in _chain(exc):
        name = type(e).__name__
        kwargs = getattr(e, "kwargs", None) or {}
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError") and kwargs.get(
            "endpoint_url"
        ):
            request = str(kwargs["endpoint_url"])
            where = next((u for u in given if "://" in u and u.split("://", 1)[1].split("/", 1)[0] in request), None)
            key = urllib.parse.urlsplit(request).path.strip("/")  # bucket/key of the request (path style)
            if where is not None and where.startswith("s3://") and key.startswith(where[5:].split("/", 1)[0]):
                where = f"s3://{key}"  # the very object that got no answer
            what = "cannot connect to" if name == "EndpointConnectionError" else "timed out talking to"
            return (  # the endpoint itself is not named: it is the user's to know, not the log's
                f"{where or 'storage'}: {what} the storage endpoint; check endpoint_url in "
                f"--storage-options (or AWS_ENDPOINT_URL) and that the server is up"
            )
        if any("Checksum" in t.__name__ for t in type(e).__mro__):  # timeouts.is_checksum_error
            where = _matching(given, str(e)) or (given[0] if given else "storage")
            return (
                f"{where}: the bytes the storage sent do not match the checksum it keeps for the object "
                f"({type(e).__name__}: {e}); read again, and if it persists restore or re-upload the object"
            )
        if isinstance(e, TimeoutError) and str(e) and not isinstance(e, LeRobotShardsError):  # ours say what to do
            return f"{e}; check that the storage server is up and reachable (endpoint_url in --storage-options)"
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            where = next((u for u in given if u.startswith("s3://")), "s3")
            return (
                f"{where}: no credentials found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or pass "
                f'"key"/"secret" (or "anon": true for public buckets) in --storage-options'
            )
        response = getattr(e, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            error = response["Error"]
            code, bucket = str(error.get("Code", "")), str(error.get("BucketName", ""))
            where = (
                named
                or _matching(given, bucket)
                or (f"s3://{bucket}" if bucket else (given[0] if given else "storage"))
            )
            if code == "NoSuchBucket":
                return f"{where}: bucket {bucket!r} does not exist; create it or correct the URL"
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                return f"{where}: access denied ({code}); check the credentials and the bucket's permissions"
            return f"{where}: the storage server refused the request ({code}: {error.get('Message', '')})"
        if isinstance(e, TypeError) and "unexpected keyword argument" in str(e):
            m = re.search(r"unexpected keyword argument '([^']+)'", str(e))
            option = m.group(1) if m else str(e)
            return (
                f"--storage-options: unknown option {option!r} for this file system; "
                "remove it or check the file system's documentation (e.g. s3fs.S3FileSystem)"
            )
        if isinstance(e, OSError) and e.errno in _ERRNO_HINTS:
            where = e.filename or (given[-1] if given else "")
            return f"{where}: {_ERRNO_HINTS[e.errno]}" if where else _ERRNO_HINTS[e.errno]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text} (run with -vv for the traceback)"
