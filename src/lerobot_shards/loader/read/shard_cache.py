"""A node-wide, bounded cache of remote files (converted shards, raw mp4s); the readers that fill it are in ``remote``.

Every DataLoader worker of every rank on a node may point at the same ``cache_dir``; nothing but
the directory is shared, so the rules are kept with file locks (``flock``), which the kernel drops
when a process dies:

- Downloaded once per node: one downloader holds the entry's lock (``.locks/``) while it
  downloads; another consumer of the same file waits on that lock, then finds the file.
- Never evicted while in use: each consumer holds a shared lock on the file's descriptor for as
  long as it uses the file; eviction takes an exclusive lock without blocking and leaves the file
  alone when that fails.
- Bounded: space is reserved under one global lock (``.cache.lock``) by creating the download's
  temporary file at its full size before a byte is written, and a finished download is renamed
  under the same lock (a scan never misses a file in mid-rename), so the sum of the cache's file
  sizes (downloads in flight included) never exceeds ``max_bytes``, at any moment. Unused files are evicted least-recently-used (access time,
  set on every use). A file that does not fit even after evicting every unused file is not cached:
  the caller reads it from storage instead.
- Only its own files: an entry counts (and may be evicted) only if the cache's index has it (its
  lock file in ``.locks/``, made before its first download); a user's files in ``cache_dir`` are
  never counted or deleted, and no symlinked folder or entry is followed.
- Verified: a download is checked against its expected size and sha256 before it gets its final
  name; a cached file of the wrong size (truncated, replaced) is deleted and fetched again. A file
  with no known digest (a raw dataset's mp4) has the xxh3-128 of the bytes written recorded next
  to its lock (``.locks/<entry>.xxh3``), and every acquire re-hashes the cached copy against it (a
  100 MB mp4 costs a few ms), so a copy damaged in place, size kept, is fetched again, not served.

Downloads are large ranged requests (``CHUNK_BYTES``) issued in order by a thread pool, and a reader
can read any byte range as soon as the chunks covering it have landed: the first episode of a
shard does not wait for the whole shard.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ...exceptions import LeRobotShardsError
from ...format import TMP_SUFFIX, member_hasher
from ...names import check_relpath
from ...safe_io import UnsafePathError, is_inside
from .integrity import IntegrityError

# Errors of the local disk (the node cache): a hint about the storage server would mislead.
LOCAL_HINTS = {
    errno.ENOSPC: "the disk of cache_dir is full; free space, lower cache_max_bytes or choose another cache_dir",
    errno.EDQUOT: "the disk quota of cache_dir is exceeded; free space or choose another cache_dir",
    errno.EROFS: "cache_dir is on a read-only file system; choose a writable cache_dir",
    errno.EISDIR: "a directory stands where the cache keeps a file; remove it from cache_dir",
    errno.ENOTDIR: "a file stands where the cache keeps a folder; remove it from cache_dir",
    errno.EEXIST: "a file stands where the cache keeps a folder; remove it from cache_dir",
    errno.EACCES: "permission denied in cache_dir; fix its permissions or choose another cache_dir",
}

CHUNK_BYTES = 8 << 20  # one ranged request: large enough to amortise a request's latency
CLOSE_WAIT_S = 30.0  # closing an unfinished download waits this long for its requests in flight
DEFAULT_CACHE_FRACTION = 0.5  # of the cache filesystem's free space (plus what the cache holds)
DEFAULT_CACHE_CAP = 1 << 40  # 1 TiB
LOCKS_DIR = ".locks"
GLOBAL_LOCK = ".cache.lock"
COUNTERS = ("storage_bytes", "cache_hits", "cache_misses", "cache_evictions", "cache_bytes_peak")


class CacheDirError(LeRobotShardsError, OSError):
    """``cache_dir`` cannot be used (not writable, read-only, a file where the cache keeps a folder)."""


def check_cache_dir(root: str, what: str = "cache_dir") -> None:
    """Make the cache's folders and its global lock now, so an unusable ``cache_dir`` (the option
    ``what``) is one error naming it when the source opens, not a bare ``PermissionError`` from a
    download thread."""
    locks = os.path.join(root, LOCKS_DIR)
    try:
        os.makedirs(locks, exist_ok=True)
        os.close(os.open(os.path.join(root, GLOBAL_LOCK), os.O_RDWR | os.O_CREAT, 0o644))
        if not os.access(locks, os.W_OK | os.X_OK):  # made by another user: no entry could be added
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), locks)
    except OSError as e:
        hint = LOCAL_HINTS.get(e.errno or 0, f"choose a writable local directory for {what}")
        if e.errno == errno.EPERM:
            hint = LOCAL_HINTS[errno.EACCES]
        hint = hint.replace("cache_dir", what)
        raise CacheDirError(e.errno, f"{what} {root}: {e.strerror} ({e.filename}); {hint}") from None


def check_owned(root: str, what: str) -> None:
    """Refuse a cache directory (the option ``what``) that another user could have filled, before
    anything is made in it.

    Where its files are verified only against checksums the directory itself holds (the frame
    cache's entries; a raw dataset's mp4s, whose xxh3 is recorded at download), whoever else may
    write there could plant well-formed files of wrong frames: a directory (or a symlink to one)
    that another user made, such as a ``/tmp/lerobot-shards-frames`` on a shared node, or one that
    every user may write. Its group may write it (user-private groups make folders 0775). A
    directory not there yet is made by ``check_cache_dir``, the user's own. A folder above it that
    every user may write without the sticky bit (/tmp has it) is refused too: whoever may rename
    entries there could put a directory of their own in its place."""
    _check_ancestors(root, what)
    if not os.path.lexists(root):
        return
    uid = os.geteuid()
    try:
        link, st = os.lstat(root), os.stat(root)
    except OSError as e:  # a dangling symlink: check_cache_dir says what is wrong with it
        if e.errno == errno.ENOENT:
            return
        raise CacheDirError(e.errno, f"{what} {root}: {e.strerror}") from None
    owner = link.st_uid if stat.S_ISLNK(link.st_mode) and link.st_uid != uid else st.st_uid
    if owner != uid:
        raise CacheDirError(
            errno.EPERM,
            f"{what} {root}: made by another user (uid {owner}), who could plant files there; "
            "choose a directory of your own",
        )
    if st.st_mode & stat.S_IWOTH:
        raise CacheDirError(
            errno.EPERM,
            f"{what} {root}: every user may write it (mode {stat.S_IMODE(st.st_mode):o}) and could plant "
            "files there; chmod o-w it, or choose a directory of your own",
        )


def _check_ancestors(root: str, what: str) -> None:
    """Refuse ``root`` when a folder above it (its real path's) may be written by every user without
    the sticky bit (see ``check_owned``)."""
    here = os.path.dirname(os.path.realpath(root))
    while True:
        try:
            mode = os.stat(here).st_mode
        except OSError:  # a folder not there yet: check_cache_dir makes it, or says why not
            mode = 0
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise CacheDirError(
                errno.EPERM,
                f"{what} {root}: every user may write {here} above it (mode {stat.S_IMODE(mode):o}, no sticky "
                "bit) and could put a directory of planted files in its place; chmod o-w (or +t) it, or "
                "choose a directory elsewhere",
            )
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent


def default_cache_bytes(cache_dir: str) -> int:
    """The cap used when only ``cache_dir`` is given: half of the space the cache could use (its
    filesystem's free space plus what it already holds), at most ``DEFAULT_CACHE_CAP``. Half,
    because the node's other jobs and checkpoints need the disk too."""
    check_cache_dir(cache_dir)
    free = shutil.disk_usage(cache_dir).free
    held = sum(e.size for e in scan(cache_dir, probe=False))
    return int(min(DEFAULT_CACHE_CAP, DEFAULT_CACHE_FRACTION * (free + held)))


class IOCounters:
    """Bytes fetched from storage and cache outcomes of one source (read by ``stats()``); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTERS, 0)

    def add(self, field: str, n: int) -> None:
        with self._lock:
            self._values[field] += n

    def peak(self, field: str, n: int) -> None:
        with self._lock:
            self._values[field] = max(self._values[field], n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


# -- eviction (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """A file in the cache directory as eviction sees it."""

    path: str
    size: int
    last_used: float  # access time
    in_use: bool  # some consumer holds its shared lock


def plan_evictions(entries: list[CacheEntry], need: int, max_bytes: int) -> list[str] | None:
    """Paths to delete, least recently used first, so that ``need`` more bytes fit in ``max_bytes``;
    None when they cannot fit without evicting a file in use (or ``need`` alone is too large)."""
    used = sum(e.size for e in entries)
    evict: list[str] = []
    for e in sorted((e for e in entries if not e.in_use), key=lambda e: (e.last_used, e.path)):
        if used + need <= max_bytes:
            break
        evict.append(e.path)
        used -= e.size
    return evict if used + need <= max_bytes else None


# -- locks and the directory ------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _in_use(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _lock_name(rel: str) -> str:
    """The entry's lock file under ``LOCKS_DIR``: created before its first download, so it also marks
    the entry as the cache's own (the cache's index)."""
    return hashlib.sha1(rel.encode()).hexdigest() + ".lock"


def _digest_name(rel: str) -> str:
    """Where the xxh3 of an entry with no known digest is recorded: under ``LOCKS_DIR``, which
    ``scan`` skips, so it is neither counted against the cap nor evicted."""
    return hashlib.sha1(rel.encode()).hexdigest() + ".xxh3"


def _recorded(path: str, size: int) -> str | None:
    """The xxh3 recorded for an entry of ``size`` bytes; None if none was (or it was for another size)."""
    try:
        with open(path) as f:
            got_size, digest = f.read().split()
    except (FileNotFoundError, ValueError):
        return None
    return digest if got_size == str(size) else None


def _record(path: str, size: int, digest: str) -> None:
    """Record an entry's xxh3 atomically (a concurrent ``_recorded`` sees the old text or the new)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
    with open(tmp, "w") as f:
        f.write(f"{size} {digest}\n")
    os.replace(tmp, path)


def _xxh3(path: str) -> str:
    h = member_hasher()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return str(h.hexdigest())


def _entry_rel(root: str, path: str) -> str:
    """The cache-relative name of the entry ``path`` belongs to (a download's temporary name included)."""
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    if rel.endswith(TMP_SUFFIX):  # f"{final}.{pid}.{thread}{TMP_SUFFIX}"
        rel = rel[: -len(TMP_SUFFIX)].rsplit(".", 2)[0]
    return rel


def scan(root: str, *, probe: bool = True) -> list[CacheEntry]:
    """Every cached or downloading file under ``root`` that the cache itself wrote.

    Only regular files with an entry in the cache's index (their lock file) count: a user's
    own files kept in ``cache_dir`` are neither counted against the cap nor ever evicted, and
    symlinks (files or folders) are not followed.
    """
    out = []
    locks = os.path.join(root, LOCKS_DIR)
    for dirpath, dirnames, filenames in os.walk(root):  # never into symlinked folders
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d != LOCKS_DIR]
            filenames = [f for f in filenames if f != GLOBAL_LOCK]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or not os.path.exists(
                os.path.join(locks, _lock_name(_entry_rel(root, path)))
            ):
                continue  # not the cache's: leave it alone
            out.append(CacheEntry(path, st.st_size, st.st_atime, probe and _in_use(path)))
    return out


def _evict(path: str) -> bool:
    """Delete ``path`` unless someone uses it (holding its exclusive lock while unlinking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # NONBLOCK: a FIFO put there opens, not hangs
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    os.unlink(path)
    os.close(fd)
    return True


def _lease(path: str, size: int, sha256: str | None = None, xxh3: str | None = None) -> int | None:
    """A descriptor of ``path`` holding its shared lock, if it exists with ``size`` bytes (and
    ``sha256``, ``xxh3`` when given); touches it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # NONBLOCK: a FIFO put there opens, not hangs
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    st = os.fstat(fd)
    try:
        same = os.stat(path).st_ino == st.st_ino  # not evicted between open and lock
    except FileNotFoundError:
        same = False
    if (
        not same
        or not stat.S_ISREG(st.st_mode)
        or st.st_size != size
        or (sha256 and _sha256(path) != sha256)
        or (xxh3 and _xxh3(path) != xxh3)
    ):
        os.close(fd)
        return None
    with contextlib.suppress(PermissionError):  # another user's file: its owner's uses order it
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))  # last use, for LRU
    return fd


# -- readers ------------------------------------------------------------------------------------------


def chunk_range(start: int, end: int, chunk: int) -> range:
    return range(start // chunk, (max(end, start + 1) - 1) // chunk + 1)


class CachedFile:
    """A cache entry in use: readable by byte range while its download proceeds; ``close`` releases it."""

    def __init__(self, fd: int, path: str, size: int, chunk: int = CHUNK_BYTES) -> None:
        self.path = path  # the final path (valid once ``wait`` returned)
        self.size = size
        self._fd = fd
        self._chunk = chunk
        self._lock = threading.Lock()
        self._closed = False
        self._parts: list[Future[None]] = []
        self.done: Future[str] = Future()

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end), waiting only for the chunks that hold them."""
        for i in chunk_range(start, min(end, self.size), self._chunk):
            if i < len(self._parts):
                self._parts[i].result()
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: read after close")
            return os.pread(self._fd, end - start, start)

    def wait(self) -> str:
        """The local path once the whole file has landed and was verified (raises on a failed download)."""
        return self.done.result()

    def close(self) -> None:
        """Release the file (it becomes evictable); an unfinished download is abandoned and deleted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for part in self._parts:
                part.cancel()
            os.close(self._fd)
        wait([self.done], timeout=CLOSE_WAIT_S)  # requests in flight end, the partial file is deleted

    def _write(self, offset: int, data: bytes) -> None:
        with self._lock:
            if self._closed:
                raise CancelledError
            os.pwrite(self._fd, data, offset)


class FileCache:
    """The cache directory as one consumer uses it; see the module docstring for the rules.

    Args:
        root: the cache directory (shared by every consumer on the node).
        max_bytes: bound on the sum of file sizes under ``root``.
        pool: threads that issue the ranged requests (the consumer's).
        counters: where bytes fetched and hits/misses/evictions are counted.
    """

    def __init__(
        self, root: str, max_bytes: int, pool: ThreadPoolExecutor, counters: IOCounters, chunk: int = CHUNK_BYTES
    ) -> None:
        self.root = root
        self.max_bytes = int(max_bytes)
        self.pool = pool
        self.counters = counters
        self.chunk = chunk
        check_cache_dir(root)

    def acquire(
        self,
        fetch: Callable[[int, int], bytes],
        rel: str,
        size: int,
        sha256: str | None,
        where: str,
        *,
        rehash: bool = False,
    ) -> CachedFile | None:
        """The cached file ``rel`` (downloading it with ``fetch(start, end)`` if absent), or None
        when it cannot fit; the caller then reads from storage. ``where`` names it in errors.
        ``rehash``: check a cached copy's sha256 too (files whose parts carry no checksums). Without
        ``sha256`` a cached copy is always checked against the xxh3 recorded when it was downloaded
        (one with none recorded is fetched again)."""
        final = os.path.join(self.root, *check_relpath(rel, f"{where}: cache path").split("/"))
        _check_ours(self.root, final, where)
        digest = os.path.join(self.root, LOCKS_DIR, _digest_name(rel)) if sha256 is None else None
        fd = self._valid(final, size, sha256 if rehash else None, digest)
        if fd is not None:
            return self._hit(fd, final, size)
        lock_path = os.path.join(self.root, LOCKS_DIR, _lock_name(rel))
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another consumer downloading it: wait, then find it
            fd = self._valid(final, size, sha256 if rehash else None, digest)
            if fd is not None:
                os.close(lock)
                return self._hit(fd, final, size)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(final)  # a copy of the wrong size or digest (truncated, damaged): fetch it again
            tmp = self._reserve(final, size)
        except BaseException:
            os.close(lock)
            raise
        if tmp is None:
            os.close(lock)
            return None
        self.counters.add("cache_misses", 1)
        return self._download(fetch, tmp, final, size, sha256, lock, where, digest)

    @staticmethod
    def _valid(final: str, size: int, sha256: str | None, digest: str | None) -> int | None:
        """``_lease`` of a cached copy that checks out: size, ``sha256`` if given, and with a
        ``digest`` file the xxh3 recorded there (no record: not trusted, as a copy this cache did
        not verify)."""
        if digest is None:
            return _lease(final, size, sha256)
        recorded = _recorded(digest, size)
        return None if recorded is None else _lease(final, size, xxh3=recorded)

    def _hit(self, fd: int, path: str, size: int) -> CachedFile:
        self.counters.add("cache_hits", 1)
        f = CachedFile(fd, path, size, self.chunk)
        f.done.set_result(path)
        return f

    def _reserve(self, final: str, size: int) -> tuple[int, str] | None:
        """Make room and create the temporary file at full size, under the global lock."""
        with _locked(os.path.join(self.root, GLOBAL_LOCK)):
            entries = scan(self.root)
            plan = plan_evictions(entries, size, self.max_bytes)
            if plan is None:
                return None
            for path in plan:
                if not _evict(path):  # taken into use since the scan
                    return None
                self.counters.add("cache_evictions", 1)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            _check_ours(self.root, final, final)  # a folder made a symlink meanwhile
            tmp = f"{final}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.ftruncate(fd, size)
            evicted = set(plan)
            self.counters.peak("cache_bytes_peak", sum(e.size for e in entries if e.path not in evicted) + size)
        return fd, tmp

    def _download(
        self,
        fetch: Callable[[int, int], bytes],
        reserved: tuple[int, str],
        final: str,
        size: int,
        sha256: str | None,
        lock: int,
        where: str,
        digest: str | None,
    ) -> CachedFile:
        fd, tmp = reserved
        f = CachedFile(fd, final, size, self.chunk)
        starts = list(range(0, size, self.chunk)) or [0]
        remaining = [len(starts)]
        guard = threading.Lock()

        def part(start: int) -> None:
            data = fetch(start, min(size, start + self.chunk))
            self.counters.add("storage_bytes", len(data))
            if len(data) != min(size, start + self.chunk) - start:
                raise ValueError(f"{where}: storage returned {len(data)} bytes at offset {start} (size {size})")
            f._write(start, data)

        def finished(_: Future[None]) -> None:
            with guard:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                for p in f._parts:
                    p.result()
                _verify(tmp, size, sha256, where)
                written = _xxh3(tmp) if digest is not None else None  # hashed before taking the lock
                # Under the global lock: a reservation's scan that listed ``tmp`` and then found
                # neither name (renamed between its listing and its stat) would not count this
                # file, and reserve past the cap (seen: 30,720 bytes on disk against 20,480). The
                # record comes first: a copy under its final name has its record.
                with _locked(os.path.join(self.root, GLOBAL_LOCK)):
                    if digest is not None and written is not None:
                        _record(digest, size, written)
                    os.replace(tmp, final)
                f.done.set_result(final)
            except BaseException as e:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                f.done.set_exception(e)
            finally:
                os.close(lock)

        try:
            for s in starts:
                f._parts.append(self.pool.submit(part, s))
        except RuntimeError:  # the consumer is closing (its pool shut down): give the reservation back
            f.close()  # cancels the parts queued so far; one already running finds it closed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.close(lock)
            raise
        for p in f._parts:
            p.add_done_callback(finished)
        return f


def _check_ours(root: str, final: str, where: str) -> None:
    """Refuse an entry whose folder leads out of the cache through a symlink, or that is a symlink:
    the cache writes and deletes only inside its own directory."""
    folder = os.path.dirname(final)
    if os.path.lexists(folder) and not is_inside(folder, root):
        raise UnsafePathError(f"{where}: cache folder {folder} is a symlink out of the cache {root}; not writing there")
    if os.path.islink(final):
        raise UnsafePathError(f"{where}: cache entry {final} is a symlink; the cache does not follow or delete it")
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(final).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a FIFO would block the first read forever
            raise UnsafePathError(
                f"{where}: cache entry {final} is not a regular file; the cache does not read or delete it"
            )


def _verify(path: str, size: int, sha256: str | None, where: str) -> None:
    got_size = os.path.getsize(path)
    got = _sha256(path) if sha256 is not None else None
    if got_size != size or got != sha256:
        raise IntegrityError(
            f"{where}: downloaded {got_size} bytes with sha256 {got}, the manifest says {size} bytes with sha256 {sha256}"
        )


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h.hexdigest()
