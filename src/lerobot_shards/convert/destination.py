"""The output location: local disk or any fsspec URL, written so nothing is ever half there.

Local files are written under ``name.tmp`` and renamed when complete. Remote objects are
built in a local temporary directory and uploaded whole: an object PUT is atomic, so a
reader sees the old object, no object or the complete new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO

import fsspec

from ..format import MANIFEST_NAME, SHARDS_DIR, TMP_SUFFIX
from ..names import check_relpath

HASH_CHUNK = 8 * 1024 * 1024
RUN_RECORD = "convert.json"  # the run's options, written first: tells own output from foreign content


class Destination:
    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        self.fs, root = fsspec.core.url_to_fs(str(url), **(storage_options or {}))
        self.root = root.rstrip("/")
        self.url = str(url)
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)
        self.is_local = "file" in protocols

    def path(self, rel: str) -> str:
        """``rel`` under the root; a name that would leave it (read from a manifest, say) raises."""
        return posixpath.join(self.root, check_relpath(rel, f"{self.url}: path"))

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        return self.fs.cat_file(self.path(rel))

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with self.fs.open(self.path(rel), "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def entries(self, rel: str = "") -> list[str]:
        """Names directly under ``rel`` (empty when it does not exist)."""
        base = self.path(rel) if rel else self.root
        self.fs.invalidate_cache(base)  # other processes and tasks write here too
        try:
            return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False))
        except FileNotFoundError:
            return []

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path(rel))

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a small file atomically (tmp + rename locally, one PUT remotely)."""
        if not self.is_local:
            self.fs.pipe_file(self.path(rel), data)
            return
        with self.open_local(rel) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_local(self, rel: str) -> Iterator[BinaryIO]:
        """A local file that appears at ``rel`` only when the block completes (fsync'd, then renamed)."""
        final = self.path(rel)
        os.makedirs(posixpath.dirname(final), exist_ok=True)
        tmp = final + TMP_SUFFIX
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        os.replace(tmp, final)

    @contextlib.contextmanager
    def staging(self, rel: str) -> Iterator[BinaryIO]:
        """A writable file for a large member: local temp name, or a local temp file uploaded when complete."""
        if self.is_local:
            with self.open_local(rel) as f:
                yield f
            return
        with tempfile.TemporaryDirectory(prefix="lerobot-shards-") as tmpdir:
            local = os.path.join(tmpdir, posixpath.basename(rel))
            with open(local, "wb") as f:
                yield f
            self.fs.put_file(local, self.path(rel))

    def clear_own_files(self) -> None:
        """Remove what a conversion writes (manifest, run record, shards); leave anything else alone."""
        for rel in (MANIFEST_NAME, RUN_RECORD):
            self.remove(rel)
        for name in self.entries(SHARDS_DIR):
            if name.startswith("shard-"):
                self.remove(posixpath.join(SHARDS_DIR, name))
