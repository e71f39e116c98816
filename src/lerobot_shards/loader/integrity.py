"""Checking the bytes the loader reads against the checksums the converter recorded.

Wrong bytes are never handed on: an episode's members are checked against the sidecar's
per-member xxh3-128 (format 2) right after its byte range is read, and a shard downloaded into
the cache dir is checked against the manifest's size and sha256 before it is renamed into place
(``cache.py``).
The caller re-fetches once on a mismatch, then raises ``IntegrityError`` (or skips the episode
when the user chose ``on_error="skip"``).
"""

from __future__ import annotations

import tarfile

from .. import format as fmt
from ..exceptions import LeRobotShardsError


class IntegrityError(LeRobotShardsError, ValueError):
    """Bytes read from a dataset do not match their recorded size or checksum."""


def check_episode_bytes(entry: fmt.EpisodeEntry, blob: bytes, start: int, where: str) -> None:
    """Raise unless every member of ``entry`` in ``blob`` (the bytes from offset ``start``) matches
    its checksum, and every member whose tar header lies in ``blob`` (all but the first) is the one
    that header names. Format 1 members carry no checksum and only get the header check.

    The header check costs one 512-byte parse per member; it catches a sidecar that points a
    camera at another camera's clip with matching checksums (two members' names swapped), which
    the checksums alone cannot, since they travel with the names."""
    with memoryview(blob) as view:
        for name, m in entry.members.items():
            at = m.offset - start
            if m.xxh3_128 is not None:
                got = fmt.member_checksum(view[at : at + m.size])
                if got != m.xxh3_128:
                    raise IntegrityError(
                        f"{where}: member {name} (bytes {m.offset}..{m.offset + m.size}) has checksum {got}, "
                        f"the sidecar says {m.xxh3_128}"
                    )
            if at >= tarfile.BLOCKSIZE:
                _check_tar_header(bytes(view[at - tarfile.BLOCKSIZE : at]), name, m.size, m.offset, where)


def _check_tar_header(block: bytes, name: str, size: int, offset: int, where: str) -> None:
    """The tar header just before a member's bytes names that member (its first 100 bytes: a longer
    name sits in a PAX record before it) with that size."""
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as e:
        raise IntegrityError(f"{where}: member {name} at byte {offset} has no tar header before it ({e})") from None
    want = name.encode("utf-8", "surrogateescape")[: tarfile.LENGTH_NAME].decode("utf-8", "surrogateescape")
    if info.name != want or info.size != size:
        raise IntegrityError(
            f"{where}: the sidecar puts member {name} ({size} bytes) at byte {offset}, where the tar holds "
            f"{info.name} ({info.size} bytes)"
        )
