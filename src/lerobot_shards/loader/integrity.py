"""Checking the bytes the loader reads against the checksums the converter recorded.

Wrong bytes are never handed on: an episode's members are checked against the sidecar's
per-member xxh3-128 (format 2) right after its byte range is read, and a shard downloaded into
the cache dir is checked against the manifest's size and sha256 before it is renamed into place
(``cache.py``).
The caller re-fetches once on a mismatch, then raises ``IntegrityError`` (or skips the episode
when the user chose ``on_error="skip"``).
"""

from __future__ import annotations

from .. import format as fmt
from ..exceptions import LeRobotShardsError


class IntegrityError(LeRobotShardsError, ValueError):
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
