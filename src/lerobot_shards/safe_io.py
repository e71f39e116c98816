"""Reading metadata without trusting the file system: bounded reads of regular files only.

A manifest or sidecar may be a FIFO (a read blocks forever), a device (a read never ends), a
symlink out of the dataset or a file of gigabytes. Metadata is read through ``read_small``,
which refuses all of these before reading and never reads more than its limit, so a hostile
or damaged dataset fails at once with one error naming the file.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from . import format as fmt
from .exceptions import LeRobotShardsError
from .filesystems import protocols
from .format import FormatError
from .timeouts import bounded


class UnsafePathError(LeRobotShardsError, ValueError):
    """A path we were to write or delete leads through a symlink out of our own directory."""


def read_small(fs: Any, path: str, limit: int, *, root: str | None = None, where: str | None = None) -> bytes:
    """The bytes of the metadata file ``path`` (at most ``limit``) on file system ``fs``.

    Local files must be regular files and, when ``root`` is given, lie inside ``root`` once
    symlinks are resolved. Remote objects are fetched with one ranged GET of ``limit + 1``
    bytes, so an oversized object is refused without being downloaded. Raises ``FormatError``
    naming ``where`` (default ``path``); a missing file raises ``FileNotFoundError``.
    """
    where = where or path
    if "file" not in protocols(fs):
        data = bounded(fs, "cat_file", path, start=0, end=limit + 1)
        if len(data) > limit:
            raise FormatError(f"{where}: larger than {limit} bytes; not a metadata file of a converted dataset")
        return bytes(data)
    local = check_local_file(path, root=root, where=where)
    fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)  # the file opened, not whatever the name points to by now
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{where}: not a regular file")
        if st.st_size > limit:
            raise FormatError(f"{where}: {st.st_size} bytes, more than the {limit} a metadata file may have")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FormatError(f"{where}: grew past {limit} bytes while being read")
    return data


def check_local_file(path: str, *, root: str | None = None, where: str | None = None) -> str:
    """``path`` when it is a regular local file (inside ``root`` once symlinks are resolved); else raise.

    Opening a FIFO would block and a symlink out of the dataset would read (or, for a writer,
    clobber) someone else's file: both are refused with ``FormatError`` naming ``where``.
    """
    where = where or path
    st = os.stat(path)  # FileNotFoundError passes: callers say what a missing file means
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{where}: not a regular file")
    if root is not None and not is_inside(path, root):
        raise FormatError(f"{where}: is a symlink to {os.path.realpath(path)}, outside the dataset {root}")
    return path


def is_inside(path: str, root: str) -> bool:
    """Whether ``path`` resolves (symlinks followed) to a place inside ``root`` (resolved too)."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, base]) == base


def read_sidecar(
    fs: Any, path: str, record: fmt.ShardRecord, manifest: fmt.Manifest, *, root: str | None, where: str
) -> tuple[fmt.Sidecar, bytes]:
    """The shard ``record``'s sidecar at ``path``, checked before use, and its bytes as read.

    Read bounded (``read_small``: its recorded size, else ``MAX_SIDECAR_BYTES``), compared with the
    sha256 the manifest records for it (format 3), parsed, and cross-checked against the manifest
    (``check_sidecar``). Every reader of a sidecar (loader, ``upload``) goes through here, so none
    uses one the manifest does not vouch for. Raises ``FormatError`` naming ``where``.
    """
    data = read_small(fs, path, record.sidecar_bytes or fmt.MAX_SIDECAR_BYTES, root=root, where=where)
    return parse_sidecar(data, record, manifest, where=where), data


def parse_sidecar(data: bytes, record: fmt.ShardRecord, manifest: fmt.Manifest, *, where: str) -> fmt.Sidecar:
    """The shard ``record``'s sidecar from its bytes (its file's, or its slice of ``sidecars.pack``):
    compared with the sha256 the manifest records for it (format 3), parsed and cross-checked."""
    if record.sidecar_sha256 is not None and fmt.sidecar_digest(data) != record.sidecar_sha256:
        raise FormatError(
            f"{where}: does not match the sha256 the manifest records for it ({record.sidecar_sha256[:16]}...): "
            "the sidecar was edited or damaged after conversion; restore it or re-convert the dataset"
        )
    sidecar = fmt.Sidecar.from_json(data, where=where)
    try:
        fmt.check_sidecar(sidecar, record, manifest)
    except FormatError as problem:
        raise FormatError(f"{where}: {problem}") from None
    return sidecar
