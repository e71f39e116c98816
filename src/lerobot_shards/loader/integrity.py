"""Checking the bytes the loader reads against the checksums the converter recorded.

Wrong bytes are never handed on: an episode's members are checked against the sidecar's
per-member xxh3-128 (format 2) right after its byte range is read, and a shard downloaded into
the cache dir is checked against the manifest's size and sha256 before it is renamed into place.
The caller re-fetches once on a mismatch, then raises ``IntegrityError`` (or skips the episode
when the user chose ``on_error="skip"``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from typing import Any

from .. import format as fmt

DOWNLOAD_CHUNK = 8 * 1024 * 1024


class IntegrityError(ValueError):
    """Bytes read from a dataset do not match their recorded size or checksum."""


def check_episode_bytes(entry: fmt.EpisodeEntry, blob: bytes, start: int, where: str) -> None:
    """Raise unless every member of ``entry`` in ``blob`` (the bytes from offset ``start``) matches
    its checksum. Format 1 members carry none and pass unchecked."""
    with memoryview(blob) as view:
        for name, m in entry.members.items():
            if m.xxh3_128 is None:
                continue
            got = fmt.member_checksum(view[m.offset - start : m.offset - start + m.size])
            if got != m.xxh3_128:
                raise IntegrityError(
                    f"{where}: member {name} (bytes {m.offset}..{m.offset + m.size}) has checksum {got}, "
                    f"the sidecar says {m.xxh3_128}"
                )


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(DOWNLOAD_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def download_verified(fs: Any, remote: str, dst: str, *, size: int, sha256: str, where: str) -> None:
    """Copy ``remote`` to the local ``dst``, hashing while writing; ``dst`` appears only when the
    bytes match ``size`` and ``sha256`` (else IntegrityError, and nothing is left behind)."""
    tmp = f"{dst}.{os.getpid()}.{threading.get_ident()}{fmt.TMP_SUFFIX}"
    h = hashlib.sha256()
    n = 0
    try:
        with fs.open(remote, "rb", block_size=DOWNLOAD_CHUNK) as src, open(tmp, "wb") as out:
            while chunk := src.read(DOWNLOAD_CHUNK):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
        if n != size or h.hexdigest() != sha256:
            raise IntegrityError(
                f"{where}: downloaded {n} bytes with sha256 {h.hexdigest()}, the manifest says {size} bytes "
                f"with sha256 {sha256}"
            )
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
