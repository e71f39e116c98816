"""Checking the bytes the loader reads against the checksums the converter recorded.

Wrong bytes are never handed on: an episode's members are checked against the sidecar's
per-member xxh3-128 (format 2) right after its byte range is read, and a shard downloaded into
the cache dir is checked against the manifest's size and sha256 before it is renamed into place
(``cache.py``).
The caller re-fetches once on a mismatch, then raises ``IntegrityError`` (or skips the episode
when the user chose ``on_error="skip"``).
"""

from __future__ import annotations

from ... import format as fmt
from ...exceptions import LeRobotShardsError
from ...tar_headers import TarHeaderError, header_start, member_header


class IntegrityError(LeRobotShardsError, ValueError):
    """Bytes read from a dataset do not match their recorded size or checksum."""


def check_episode_bytes(entry: fmt.EpisodeEntry, blob: bytes, start: int, where: str) -> None:
    """Raise unless every member of ``entry`` in ``blob`` (the bytes from offset ``start``) matches
    its checksum, and every member whose tar headers lie in ``blob`` (all but the first) is the one
    those headers name. Format 1 members carry no checksum and only get the header check.

    The header check parses the few blocks between one member's end and the next one's data;
    it catches a sidecar that points a camera at another camera's clip with matching checksums
    (two members' names swapped), which the checksums alone cannot, since they travel with the
    names. Members are taken in tar order, so each one's headers start where the previous ends."""
    previous_end: int | None = None
    with memoryview(blob) as view:
        for m in sorted(entry.members.values(), key=lambda m: m.offset):
            at = m.offset - start
            if m.xxh3_128 is not None:
                got = fmt.member_checksum(view[at : at + m.size])
                if got != m.xxh3_128:
                    raise IntegrityError(
                        f"{where}: member {m.name} (bytes {m.offset}..{m.offset + m.size}) has checksum {got}, "
                        f"the sidecar says {m.xxh3_128}"
                    )
            if previous_end is not None:
                _check_tar_headers(view[header_start(previous_end) - start : at], m, where)
            previous_end = m.offset + m.size


def _check_tar_headers(headers: memoryview, m: fmt.Member, where: str) -> None:
    """The tar headers in front of a member's bytes (the PAX ``path`` record, where there is one,
    names it) give that member's name and size."""
    try:
        name, size = member_header(headers)
    except TarHeaderError as e:
        raise IntegrityError(f"{where}: member {m.name} at byte {m.offset}: {e}") from None
    if name != m.name or size != m.size:
        raise IntegrityError(
            f"{where}: the sidecar puts member {m.name} ({m.size} bytes) at byte {m.offset}, where the tar holds "
            f"{name} ({size} bytes)"
        )
