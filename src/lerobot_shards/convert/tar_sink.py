"""The low-level tar sink: tar members written byte for byte as ``tarfile`` writes them, hashed on the way.

The shard writer hands it members in order; the sink writes headers, data and padding, and
hashes and counts every byte without reading the output back. Members held as ``FileRanges``
(the byte ranges of a local source file) go file to file with ``os.copy_file_range`` while a
helper thread hashes the same bytes from the page cache, so a stream-copied clip never passes
through Python memory.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import io
import mmap
import os
import stat
import tarfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Final

from ..exceptions import ConvertError
from ..format import Member, member_hasher

TAR_FORMAT: Final = tarfile.PAX_FORMAT  # ustar headers unless a name exceeds 100 characters
MEMBER_MODE = 0o644

COPY_CHUNK = 16 * 1024 * 1024  # read+write fallback chunk when a range cannot be copied in the kernel
SMALL_WRITE = 1024 * 1024  # headers, padding and small members are gathered up to this before a write
HASH_BACKLOG = 64 * 1024 * 1024  # in-memory bytes the hasher may lag behind the writer
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM, errno.ENOTSUP}


@dataclass(frozen=True)
class FileRanges:
    """A member's bytes without holding them: ``prefix``, then byte ranges of the local file ``path``.

    ``stat`` (inode, size, mtime) is the file's when the ranges were taken; the writer refuses a
    file that has changed since.
    """

    path: str
    prefix: bytes
    ranges: tuple[tuple[int, int], ...]
    stat: tuple[int, int, int]

    @property
    def size(self) -> int:
        """The member's size in bytes."""
        return len(self.prefix) + sum(n for _, n in self.ranges)

    def read(self) -> bytes:
        """The member's bytes in memory (tests, and the rare uncached stream-facts probe)."""
        with open(self.path, "rb") as f:
            parts = [self.prefix]
            for offset, n in self.ranges:
                parts.append(os.pread(f.fileno(), n, offset))
        data = b"".join(parts)
        if len(data) != self.size:
            raise ConvertError(f"{self.path}: file ended before the clip's bytes")
        return data


Payload = bytes | FileRanges


def payload_size(payload: Payload) -> int:
    """Bytes of a member, whether held in memory or as file ranges."""
    return payload.size if isinstance(payload, FileRanges) else len(payload)


def file_stat(st: os.stat_result) -> tuple[int, int, int]:
    """(inode, size, mtime) of a file: the writer refuses a source that changed since it was planned."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _fd_of(out: BinaryIO) -> int | None:
    """``out``'s file descriptor when it is a regular file the kernel can copy into, else None."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    try:
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None


class TarSink:
    """Writes the tar's bytes and hashes and counts them, reading nothing back.

    Small pieces (tar headers, padding, small members) are gathered and written together.
    Ranges of a local file go file to file: ``os.copy_file_range`` (then ``os.sendfile``, then
    read+write, where the kernel refuses) while the helper thread hashes the same range through
    a read-only memory map of the source (page cache, no copy). Hashing runs in order on one
    helper thread (hashlib releases the GIL); in-memory data waiting for it is bounded by
    HASH_BACKLOG. When ``out`` has no regular-file descriptor, everything goes through
    ``out.write`` in chunks.
    """

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.offset = 0  # bytes of the tar so far, gathered ones included
        self._buf = bytearray()
        self._sha = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._pending: collections.deque[tuple[Future[None], int]] = collections.deque()
        self._held = 0
        self._sources: dict[str, int] = {}  # open source file descriptors by path
        self._member_hashers: dict[str, Any] = {}  # per-member checksums, complete once the hasher drains
        self._fd = _fd_of(out)
        self._copy = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        self._base = 0  # where the tar starts in the file
        self._fadvise = self._fd is not None and hasattr(os, "posix_fadvise")
        if self._fd is not None:
            out.flush()  # from here on the descriptor is written directly
            self._base = os.lseek(self._fd, 0, os.SEEK_CUR)

    # -- hashing --------------------------------------------------------------------------

    def _hash(self, fn: Callable[..., None], *args: Any, held: int = 0) -> None:
        self._pending.append((self._hasher.submit(fn, *args), held))
        self._held += held
        while self._pending and (self._held > HASH_BACKLOG or self._pending[0][0].done()):
            future, n = self._pending.popleft()
            future.result()  # re-raises a hashing error
            self._held -= n

    def _hash_range(self, fd: int, offset: int, size: int, member: Any) -> None:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(fd, offset + size - start, flags=flags, prot=mmap.PROT_READ, offset=start) as m:
            with memoryview(m) as view, view[offset - start :] as data:
                self._sha.update(data)
                member.update(data)

    # -- writing --------------------------------------------------------------------------

    def _write_out(self, data: bytes | memoryview) -> None:
        if self._fd is None:
            self.out.write(data)
            return
        with memoryview(data) as view:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]

    def _emit(self, data: bytes) -> None:
        """Hash (behind) and write an immutable buffer."""
        self._hash(self._sha.update, data, held=len(data))
        self._write_out(data)

    def flush(self) -> None:
        """Write out the gathered small pieces."""
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            self._emit(data)

    def write(self, data: bytes) -> None:
        """Append bytes to the tar (gathered while small, so many headers cost one write)."""
        if len(data) < SMALL_WRITE:
            self._buf += data
            if len(self._buf) >= SMALL_WRITE:
                self.flush()
        else:
            self.flush()
            self._emit(bytes(data))  # no copy for bytes; the hasher needs an immutable buffer
        self.offset += len(data)

    def _source(self, path: str, expect: tuple[int, int, int]) -> int:
        fd = self._sources.get(path)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._sources[path] = fd
        if file_stat(os.fstat(fd)) != expect:
            raise ConvertError(f"{path}: the file changed while it was being converted")
        return fd

    def copy_range(self, path: str, offset: int, size: int, expect: tuple[int, int, int], member: Any) -> None:
        """Append ``size`` bytes of ``path`` at ``offset``: hashed on the helper thread while copied."""
        src = self._source(path, expect)
        self.flush()
        self._hash(self._hash_range, src, offset, size, member)
        if self._fd is None:
            self._copy_chunks(src, offset, size)
        else:
            self._copy_kernel(src, offset, size)
            self._start_writeback(self.offset, size)
        self.offset += size

    def _start_writeback(self, offset: int, size: int) -> None:
        """Start writing a copied range back to disk now, so the final fsync has little left to do.

        POSIX_FADV_DONTNEED on dirty pages starts their writeback without waiting for it; pages
        still dirty or under writeback stay cached (only already clean ones may be dropped).
        """
        if self._fadvise:
            try:
                os.posix_fadvise(self._fd, self._base + offset, size, os.POSIX_FADV_DONTNEED)  # type: ignore[arg-type]
            except OSError:
                self._fadvise = False

    def _copy_kernel(self, src: int, offset: int, size: int) -> None:
        assert self._fd is not None
        done = 0
        while done < size:
            try:
                if self._copy == "copy_file_range":
                    n = os.copy_file_range(src, self._fd, size - done, offset + done)
                elif self._copy == "sendfile":
                    n = os.sendfile(self._fd, src, offset + done, size - done)
                else:
                    self._copy_chunks(src, offset + done, size - done)
                    return
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                # This kernel or file system cannot do it: the next method, from where we are.
                # (A failed call copies nothing, so the file position is still right.)
                self._copy = "sendfile" if self._copy == "copy_file_range" else "read"
                continue
            if n == 0:
                raise ConvertError(f"source file ended {size - done} bytes early while copying")
            done += n

    def _copy_chunks(self, src: int, offset: int, size: int) -> None:
        end = offset + size
        while offset < end:
            data = os.pread(src, min(COPY_CHUNK, end - offset), offset)
            if not data:
                raise ConvertError(f"source file ended {end - offset} bytes early while copying")
            self._write_out(data)
            offset += len(data)

    # -- tar ------------------------------------------------------------------------------

    def add(self, name: str, payload: Payload) -> Member:
        """One tar member, as tarfile.addfile writes it: header, data, zero padding to a block."""
        size = payload_size(payload)
        info = tarfile.TarInfo(name)
        info.size = size
        info.mtime = 0
        info.mode = MEMBER_MODE
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self.write(info.tobuf(TAR_FORMAT, tarfile.ENCODING, "surrogateescape"))
        start = self.offset
        checksum = self._member_hashers[name] = member_hasher()
        if isinstance(payload, FileRanges):
            checksum.update(payload.prefix)
            self.write(payload.prefix)
            for offset, n in payload.ranges:
                self.copy_range(payload.path, offset, n, payload.stat, checksum)
        else:
            checksum.update(payload)  # xxh3 at tens of GB/s: not worth the helper thread
            self.write(payload)
        if self.offset - start != size:
            raise ConvertError(f"{name}: wrote {self.offset - start} bytes, expected {size}")
        remainder = size % tarfile.BLOCKSIZE
        if remainder:
            self.write(tarfile.NUL * (tarfile.BLOCKSIZE - remainder))
        return Member(name, start, size)

    def finish(self) -> str:
        """End of archive as tarfile.close writes it (two zero blocks, zeros to a whole record); the sha256."""
        self.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))
        remainder = self.offset % tarfile.RECORDSIZE
        if remainder:
            self.write(tarfile.NUL * (tarfile.RECORDSIZE - remainder))
        self.flush()
        if self._fd is not None:
            # Write back while the hasher catches up (fsync releases the GIL): the destination's
            # fsync before its rename then finds nothing dirty. Local staging of a remote upload
            # pays a little writeback for nothing; local output would pay it anyway.
            os.fsync(self._fd)
        self._drain()
        return self._sha.hexdigest()

    def checksummed(self, member: Member) -> Member:
        """``member`` with its checksum (format 2), once ``finish`` has drained the hasher."""
        assert not self._pending, "checksummed() before finish()"
        return replace(member, xxh3_128=self._member_hashers[member.name].hexdigest())

    def _drain(self) -> None:
        while self._pending:
            future, n = self._pending.popleft()
            future.result()
            self._held -= n

    def close(self) -> None:
        """Wait for the hasher and release threads and source files (also after an error)."""
        try:
            for future, _ in self._pending:
                future.exception()  # wait; an error here is secondary to the one being raised
            self._pending.clear()
        finally:
            self._hasher.shutdown()
            for fd in self._sources.values():
                os.close(fd)
            self._sources.clear()
