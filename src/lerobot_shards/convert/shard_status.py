"""Is a shard complete? One answer for the converter's resume and finalize and for the verifier.

A shard is complete when its tar and its sidecar both exist, the sidecar parses, and the tar
has the size (and, when asked, the sha256) that the sidecar records: the sidecar is written
after its tar is complete, so these facts together mean a finished write. Whether the shard
holds the episodes a plan puts there is a second question (``ShardStatus.holds``), asked by
whoever knows the plan.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..format import FORMAT_VERSION, MAX_SIDECAR_BYTES, SHARDS_DIR, FormatError, Sidecar, sidecar_digest
from .destination import Destination


@dataclass(frozen=True)
class ShardStatus:
    """What ``shard_status`` found: the parsed sidecar (when readable) and why the shard is not complete."""

    sidecar: Sidecar | None
    problem: str | None  # None: complete
    sidecar_sha256: str | None = None  # of the sidecar file's bytes, for the manifest (format 3)
    sidecar_bytes: int | None = None
    sidecar_data: bytes = b""  # the sidecar file's bytes as read: what ``sidecars.pack`` concatenates

    @property
    def complete(self) -> bool:
        """True when the shard needs no rebuilding (``problem`` is None)."""
        return self.problem is None

    def holds(self, planned: Sequence[int]) -> bool:
        """The sidecar accounts for exactly ``planned``, in plan order: each episode either listed
        or recorded as skipped (``--skip-bad-episodes``)."""
        if self.sidecar is None:
            return False
        kept = [e for e in planned if e not in self.sidecar.skipped]
        listed = [e.episode_index for e in self.sidecar.episodes]
        return listed == kept and set(self.sidecar.skipped) <= set(planned)


def shard_status(
    dest: Destination,
    tar: str,
    sidecar: str,
    *,
    present: Collection[str] | None = None,
    check_sha256: bool = False,
    version: int = FORMAT_VERSION,
) -> ShardStatus:
    """The status of the shard whose files in ``dest``'s shards directory are ``tar`` and ``sidecar``.

    ``present`` lists the shards directory once for many calls (else each file is looked up).
    ``check_sha256`` reads the whole tar to compare its hash with the sidecar's. A sidecar of
    another ``version`` (an older conversion, when resuming) makes the shard incomplete.
    """
    rel_tar, rel_side = posixpath.join(SHARDS_DIR, tar), posixpath.join(SHARDS_DIR, sidecar)

    def exists(name: str, rel: str) -> bool:
        return name in present if present is not None else dest.exists(rel)

    if not exists(tar, rel_tar):
        return ShardStatus(None, "no tar")
    if not exists(sidecar, rel_side):
        return ShardStatus(None, "no sidecar")
    try:
        data = dest.read_bytes(rel_side, limit=MAX_SIDECAR_BYTES)
        parsed = Sidecar.from_json(data, where=dest.path(rel_side))
    except (FileNotFoundError, FormatError, ValueError, KeyError) as e:
        return ShardStatus(None, f"unreadable sidecar ({e})")
    digest, nbytes = sidecar_digest(data), len(data)
    if parsed.format_version != version:  # an older version's shard: rebuilt, not mixed in
        return ShardStatus(parsed, f"format_version {parsed.format_version}, expected {version}", digest, nbytes)
    size = dest.size(rel_tar)
    if size != parsed.size:
        return ShardStatus(parsed, f"{size} bytes, sidecar says {parsed.size}", digest, nbytes)
    if check_sha256 and dest.sha256(rel_tar) != parsed.sha256:
        return ShardStatus(parsed, "sha256 differs from the sidecar's", digest, nbytes)
    return ShardStatus(parsed, None, digest, nbytes, data)
