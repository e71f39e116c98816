"""The output location: local disk or any fsspec URL, written so nothing is ever half there.

Local files are written under ``name.tmp`` and renamed when complete. Remote objects are
built in a local temporary directory and uploaded whole: an object PUT (or a multipart upload,
which appears only when completed) is atomic, so a reader sees the old object, no object or the
complete new one. Every remote write has bounded retries with exponential backoff and checks the
object's size afterwards; ``convert`` and ``upload`` both write through here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import inspect
import logging
import os
import posixpath
import random
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, TypeVar

from fsspec.callbacks import Callback

from ..exceptions import LeRobotShardsError
from ..filesystems import protocols, url_to_fs
from ..format import MANIFEST_NAME, MAX_MANIFEST_BYTES, SHARDS_DIR, SIDECAR_PACK_NAME, TMP_SUFFIX
from ..names import check_relpath
from ..redaction import redact, register_secrets, without_credentials
from ..safe_io import UnsafePathError, is_inside, read_small
from ..timeouts import bounded, is_timeout, open_bounded, with_timeouts

HASH_CHUNK = 8 * 1024 * 1024
LOCK_NAME = ".lock"  # local destinations: byte-range locks, one byte per shard index
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
OWN_SHARD_FILE = re.compile(
    r"shard-\d{6}\.(tar|idx\.json)(\.\d+-[0-9a-f]{8}\.tmp)?"
)  # shard_name, sidecar_name, tmp_name
LEROBOT_INFO = "meta/info.json"  # marks a raw LeRobot dataset (a source, never a destination)
RUN_RECORD = "convert.json"  # the run's options, written first: tells own output from foreign content
# Top-level names a conversion writes besides the shards: its lock and (while writing) the temporary
# names of its run record and manifest. Another array task's ``convert.json.<pid>-<hex>.tmp`` seen
# before its rename must not make the destination look like foreign content.
OWN_TOP_FILE = re.compile(
    rf"{re.escape(LOCK_NAME)}|({re.escape(RUN_RECORD)}|{re.escape(MANIFEST_NAME)}|{re.escape(SIDECAR_PACK_NAME)})"
    r"\.\d+-[0-9a-f]{8}\.tmp"
)

RETRY_ATTEMPTS = 5  # tries per remote write: waits of about 0.5, 1, 2, 4 s in between (with jitter)
RETRY_FIRST_WAIT_S = 0.5
RETRY_MAX_WAIT_S = 8.0
UPLOAD_MIN_BYTES_PER_S = 256 * 1024  # an upload slower than this on average is given up (plus the call bound)
# Errors no retry can fix: a missing bucket or local file, refused access, a bad option.
PERMANENT_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    NotImplementedError,
    TypeError,
    ValueError,
)
log = logging.getLogger(__name__)
T = TypeVar("T")

ByteProgress = Callable[[int], None]  # receives byte counts as they are sent (negative: a failed try's bytes)


class TransferError(LeRobotShardsError, OSError):
    """A remote write still failed after its retries."""


class _Forward(Callback):
    """An fsspec callback that forwards byte increments to a ``ByteProgress`` and counts them."""

    def __init__(self, progress: ByteProgress | None) -> None:
        super().__init__()
        self.progress = progress
        self.sent = 0

    def relative_update(self, inc: int = 1) -> None:
        self.add(inc)

    def absolute_update(self, value: int) -> None:
        self.add(value - self.sent)

    def add(self, n: int) -> None:
        self.sent += n
        if self.progress is not None and n:
            self.progress(n)


class DestinationBusy(LeRobotShardsError, RuntimeError):
    """Another conversion is writing the same shards into this destination."""


def _ancestors(path: str) -> Iterator[str]:
    """``path`` and every folder above it, up to the file system root."""
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _local_inside(path: str, root: str) -> bool:
    """Whether the local ``path`` is ``root`` or lies under it: both resolved (symlinks followed), or
    a folder on ``path``'s way is ``root`` itself (the same folder reached another way: a bind mount)."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) == base:
        return True
    if not os.path.isdir(base):
        return False
    return any(os.path.isdir(p) and os.path.samefile(p, base) for p in _ancestors(real))


def _remote_inside(path: str, root: str) -> bool:
    """Whether the object-store prefix ``path`` is ``root`` or lies under it, literally or once ``.``,
    ``..`` and doubled slashes are normalized (whichever a store applies, both are caught)."""
    for p, r in ((path.strip("/"), root.strip("/")), (_normal(path), _normal(root))):
        if p == r or r in ("", ".") or p.startswith(r + "/"):
            return True
    return False


def _normal(path: str) -> str:
    return posixpath.normpath("/" + path.strip("/")).strip("/")


def overlap(fs_a: Any, root_a: str, fs_b: Any, root_b: str) -> str | None:
    """How location a relates to location b when they overlap: ``"is"``, ``"lies inside"`` or
    ``"holds"``; None when writing to one cannot touch the other. Local paths are resolved
    (symlinks, ``..``); URLs compare by protocol and normalized path (different endpoints with the
    same bucket count as the same place: a refusal, never a write into the source)."""
    local_a, local_b = "file" in protocols(fs_a), "file" in protocols(fs_b)
    if local_a != local_b or not (local_a or set(protocols(fs_a)) & set(protocols(fs_b))):
        return None
    inside = _local_inside if local_a else _remote_inside
    a_in_b, b_in_a = inside(root_a, root_b), inside(root_b, root_a)
    if a_in_b and b_in_a:
        return "is"
    return "lies inside" if a_in_b else "holds" if b_in_a else None


STAGING_PREFIX = "lerobot-shards-staging-"  # + the staging process's pid: TMPDIR folders of uploads
STALE_STAGING_S = 3600.0
_swept: list[int] = []
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-[\w]+")


def sweep_staging(tmpdir: str | None = None, *, now: float | None = None) -> int:
    """Remove the upload staging folders a killed conversion left in ``TMPDIR`` (a shard each, up to
    512 MB, per worker and preemption): only this converter's (by name), only when no process of
    that pid runs here and nothing in the folder changed for an hour (a converter in another
    PID namespace sharing TMPDIR keeps writing). Returns how many were removed."""
    root = tmpdir or tempfile.gettempdir()
    now = time.time() if now is None else now
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    removed = 0
    for name in names:
        found = _STAGING.fullmatch(name)
        path = os.path.join(root, name)
        if not found or os.path.islink(path) or not os.path.isdir(path) or _running(int(found.group(1))):
            continue
        with contextlib.suppress(OSError):
            times = [os.lstat(path).st_mtime, *(os.lstat(os.path.join(path, f)).st_mtime for f in os.listdir(path))]
            if now - max(times) > STALE_STAGING_S:
                shutil.rmtree(path)
                removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def tmp_name(final: str) -> str:
    """A temporary name next to ``final`` that no other process or call uses."""
    return f"{final}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"


@contextlib.contextmanager
def _named_errors(path: str) -> Iterator[None]:
    """OSErrors from writes (ENOSPC, EROFS, ...) carry no file name: give them ``path``."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno in _WRITE_ERRNOS:
            raise OSError(e.errno, e.strerror, path) from e
        raise


class Destination:
    """A conversion's output root (local path or fsspec URL): every read and write by relative name.

    Names are confined to the root (``path``), local writes go through a temporary name and a
    rename, remote ones through one whole-object upload.
    """

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        without_credentials(str(url))  # registers a URL's password as a secret: never printed
        storage_options = with_timeouts(str(url), storage_options)  # no call waits on a silent server for long
        self.fs, root = url_to_fs(str(url), **(storage_options or {}))
        self.root = root.rstrip("/")
        self.url = str(url)
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)
        self.is_local = "file" in protocols
        register_secrets(storage_options)  # keys and secrets never reach a message or a log line

    def retrying(self, what: str, fn: Callable[[], T], *, attempts: int = RETRY_ATTEMPTS) -> T:
        """``fn()``, tried up to ``attempts`` times with exponential backoff; ``what`` names the object in
        warnings and in the final ``TransferError``. Permanent errors (``PERMANENT_ERRORS``) are not retried."""
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except PERMANENT_ERRORS:
                raise
            except Exception as e:
                reason = redact(f"{type(e).__name__}: {e}")
                if is_timeout(e):  # the storage's own client retried it already: another try only waits again
                    raise TransferError(f"{what}: the storage did not answer ({reason})") from None
                if attempt == attempts:
                    raise TransferError(f"{what}: failed after {attempts} attempts ({reason})") from None
                wait = min(RETRY_MAX_WAIT_S, RETRY_FIRST_WAIT_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                log.warning("%s: %s; retrying in %.1f s (attempt %d of %d)", what, reason, wait, attempt + 1, attempts)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _concurrency(self, parts_at_once: int | None) -> dict[str, int]:
        put = getattr(self.fs, "_put_file", None)  # async file systems (s3fs) name their options here
        if parts_at_once is None or put is None or "max_concurrency" not in inspect.signature(put).parameters:
            return {}
        return {"max_concurrency": parts_at_once}

    def put_file(
        self, local: str, rel: str, *, progress: ByteProgress | None = None, parts_at_once: int | None = None
    ) -> None:
        """Copy the local file ``local`` to ``rel``, atomically, with retries; the remote size is checked.

        ``progress`` gets the bytes as they go (fsspec callback), and the bytes of a failed try back
        as a negative count, so a progress bar never counts a byte twice. ``parts_at_once`` bounds
        the parts of one multipart upload in flight (and so its memory: s3fs holds each 50 MiB part)
        on file systems whose put takes ``max_concurrency``; None keeps the file system's default.
        """
        size = os.path.getsize(local)
        if self.is_local:
            with self.open_local(rel) as dst, open(local, "rb") as src:
                shutil.copyfileobj(src, dst, HASH_CHUNK)
            if progress is not None:
                progress(size)
            return
        remote = self.path(rel)

        def attempt() -> None:
            callback = _Forward(progress)
            try:
                put = dict(callback=callback, **self._concurrency(parts_at_once))
                bounded(self.fs, "put_file", local, remote, extra_s=size / UPLOAD_MIN_BYTES_PER_S, **put)
                self.fs.invalidate_cache(remote)
                got = int(bounded(self.fs, "info", remote)["size"])
                if got != size:
                    raise OSError(f"the stored object has {got} bytes, {size} were sent")
            except BaseException:
                callback.add(-callback.sent)
                raise
            callback.add(size - callback.sent)  # file systems that report no progress

        self.retrying(f"{self.url}/{rel}", attempt)

    def path(self, rel: str) -> str:
        """``rel`` under the root; a name that would leave it (read from a manifest, say) raises."""
        return posixpath.join(self.root, check_relpath(rel, f"{self.url}: path"))

    def confined(self, rel: str) -> str:
        """``path(rel)`` of a local destination, refused (``UnsafePathError``) when it, or a folder on
        the way (``shards/``, say), is a symlink leading out of the root: nothing is read, written
        or deleted there through a link."""
        path = self.path(rel)
        if self.is_local:
            probe = path if os.path.lexists(path) else posixpath.dirname(path)
            while not os.path.lexists(probe) and probe != self.root:
                probe = posixpath.dirname(probe)
            if os.path.lexists(probe) and not is_inside(probe, self.root):
                raise UnsafePathError(
                    f"{path}: leads out of {self.root} through a symlink ({os.path.realpath(probe)}); "
                    "not reading, writing or deleting there"
                )
        return path

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists under the root."""
        return bool(bounded(self.fs, "exists", self.path(rel)))

    def size(self, rel: str) -> int:
        """Size of ``rel`` in bytes."""
        return int(bounded(self.fs, "size", self.path(rel)))

    def read_bytes(self, rel: str, limit: int = MAX_MANIFEST_BYTES) -> bytes:
        """The whole content of a small file (run record, sidecar, manifest): at most ``limit`` bytes of a
        regular file inside the root (``safe_io.read_small``)."""
        return read_small(self.fs, self.path(rel), limit, root=self.root if self.is_local else None)

    def sha256(self, rel: str) -> str:
        """sha256 of ``rel``, read in chunks (a shard does not fit memory)."""
        h = hashlib.sha256()
        with open_bounded(self.fs, self.confined(rel), block_size=HASH_CHUNK) as f:
            while chunk := f.read(HASH_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def entries(self, rel: str = "") -> list[str]:
        """Names directly under ``rel`` (empty when it does not exist)."""
        base = self.path(rel) if rel else self.root
        self.fs.invalidate_cache(base)  # other processes and tasks write here too
        try:
            return sorted(posixpath.basename(p.rstrip("/")) for p in bounded(self.fs, "ls", base, detail=False))
        except FileNotFoundError:
            return []

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Sizes of the files directly under ``rel`` by name, from one listing (empty when it does not exist)."""
        base = self.path(rel) if rel else self.root
        self.fs.invalidate_cache(base)
        try:
            listing = bounded(self.fs, "ls", base, detail=True)
        except FileNotFoundError:
            return {}
        return {posixpath.basename(i["name"].rstrip("/")): int(i["size"]) for i in listing if i["type"] == "file"}

    def remove(self, rel: str) -> None:
        """Delete ``rel``; a file already gone is fine. Never through a symlinked folder."""
        with contextlib.suppress(FileNotFoundError):
            bounded(self.fs, "rm_file", self.confined(rel))

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a small file atomically (tmp + rename locally, one PUT remotely)."""
        if not self.is_local:
            self.retrying(f"{self.url}/{rel}", lambda: bounded(self.fs, "pipe_file", self.path(rel), data))
            return
        with self.open_local(rel) as f:
            f.write(data)

    def create_bytes(self, rel: str, data: bytes) -> bool:
        """Write a small file unless ``rel`` exists; True when this call created it.

        Locally exclusive: a complete temporary file is hard-linked to ``rel``, which fails if a
        process got there first (two array tasks started at once: one wins, the other reads the
        winner's file). On S3 a conditional PUT (``If-None-Match: *``), which AWS S3 and compatible
        stores refuse when the object exists; elsewhere (or a store that answers it is not
        implemented) a look then one PUT. A store that ignores the condition overwrites: the
        caller reads the file back either way.
        """
        if not self.is_local:
            # a conditional PUT where this s3fs offers one (``mode="create"``); an older one lacks it
            if "s3" in protocols(self.fs) and "mode" in inspect.signature(self.fs._pipe_file).parameters:
                try:
                    self.retrying(
                        f"{self.url}/{rel}",
                        lambda: bounded(self.fs, "pipe_file", self.path(rel), data, mode="create"),
                    )
                    return True
                except FileExistsError:  # a retry of our own PUT finds it too: the read-back tells
                    return False
                except NotImplementedError:
                    pass
            if self.exists(rel):
                return False
            self.write_bytes(rel, data)
            return True
        final = self.confined(rel)
        tmp = tmp_name(final)
        try:
            with _named_errors(tmp):
                os.makedirs(posixpath.dirname(final), exist_ok=True)
                with open(tmp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            with _named_errors(final):
                try:
                    os.link(tmp, self.confined(rel))
                except OSError as e:  # no hard links here (some FUSE and network file systems)
                    if isinstance(e, FileExistsError) or e.errno not in _NO_LINKS:
                        raise
                    with open(self.confined(rel), "xb") as f:  # exclusive too; not atomic to readers
                        f.write(data)
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)

    @contextlib.contextmanager
    def open_local(self, rel: str) -> Iterator[BinaryIO]:
        """A local file that appears at ``rel`` only when the block completes (fsync'd, then renamed).

        The temporary name is this process's own (``tmp_name``), so concurrent writers of one
        name (array tasks writing the same run record) never trip over each other's file; the
        last complete rename wins, and all of them write the same bytes.
        """
        final = self.confined(rel)
        tmp = tmp_name(final)
        try:
            with _named_errors(tmp):
                os.makedirs(posixpath.dirname(final), exist_ok=True)
                self.confined(rel)  # a folder made a symlink meanwhile
                with open(tmp, "xb") as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        with _named_errors(final):
            os.replace(tmp, final)

    @contextlib.contextmanager
    def staging(self, rel: str) -> Iterator[BinaryIO]:
        """A writable file for a large member: local temp name, or a local temp file uploaded when complete.

        Uploads are staged in the system temporary directory (``TMPDIR``): it needs room for one
        shard per worker.
        """
        if self.is_local:
            with self.open_local(rel) as f:
                yield f
            return
        if not _swept:  # once per process
            _swept.append(sweep_staging())
        with tempfile.TemporaryDirectory(prefix=f"{STAGING_PREFIX}{os.getpid()}-") as tmpdir:
            local = os.path.join(tmpdir, posixpath.basename(rel))
            with _named_errors(local), open(local, "wb") as f:
                yield f
            self.put_file(local, rel)

    def remove_stale_tmp(self, rel_dir: str, prefixes: Iterable[str]) -> int:
        """Remove leftover temporary files (of killed runs) whose names start with one of ``prefixes``.

        Only for names this process owns exclusively (the shards under its lock). Returns the count.
        """
        if not self.is_local:
            return 0  # remote uploads are staged locally: nothing half-written reaches the bucket
        prefixes = tuple(prefixes)
        removed = 0
        for name in self.entries(rel_dir):
            if name.endswith(TMP_SUFFIX) and name.startswith(prefixes):
                self.remove(posixpath.join(rel_dir, name))
                removed += 1
        return removed

    @contextlib.contextmanager
    def lock(self, shards: Iterable[int] | None) -> Iterator[None]:
        """Hold the right to write ``shards`` (all of them when None) for the block.

        Local destinations: POSIX byte-range locks on ``OUT/.lock``, one byte per shard index, so
        array tasks (disjoint shards) run side by side while a second run over the same shards
        is refused. The kernel drops the locks when the process dies: no stale lock after kill -9.
        Remote destinations take no lock: a shard is uploaded whole, and every run of one
        conversion (one run record) writes the same bytes for it, so concurrent runs waste work
        but never corrupt output.
        Raises DestinationBusy when another process holds any of them.
        """
        if not self.is_local:
            yield
            return
        with _named_errors(self.root):
            os.makedirs(self.root, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)  # never through a link
            fd = os.open(self.path(LOCK_NAME), flags, 0o644)
        try:
            runs = [(0, 0)] if shards is None else _runs(sorted(set(shards)))
            for start, length in runs:  # length 0: from start to the end of any file
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
                except OSError as e:
                    if e.errno not in (errno.EACCES, errno.EAGAIN):
                        raise
                    what = "shards" if shards is None else f"shard {start}" if length == 1 else "shards"
                    span = "" if shards is None or length == 1 else f" {start}..{start + length - 1}"
                    raise DestinationBusy(
                        f"{self.url}: another conversion is writing {what}{span} here right now (lock "
                        f"{self.path(LOCK_NAME)}); wait for it to finish, then re-run to resume"
                    ) from None
            yield
        finally:
            os.close(fd)  # releases every lock this process holds on the file

    def clear_own_files(self) -> None:
        """Remove what a conversion writes (manifest, sidecar pack, run record, shard tars and sidecars and their
        temporary files, by their exact name patterns); leave anything else alone, and refuse a
        ``shards/`` that is a symlink out of the destination before deleting anything."""
        self.confined(SHARDS_DIR)
        for rel in (MANIFEST_NAME, SIDECAR_PACK_NAME, RUN_RECORD):
            self.remove(rel)
        for name in self.entries(SHARDS_DIR):
            rel = posixpath.join(SHARDS_DIR, name)
            if not OWN_SHARD_FILE.fullmatch(name):
                continue
            if self.is_local and os.path.islink(self.path(rel)):
                log.warning("--overwrite: leaving %s alone: a symlink, not a file this converter wrote", self.path(rel))
                continue
            self.remove(rel)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct integers as (start, length) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
