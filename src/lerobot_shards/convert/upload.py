"""``lerobot-shards upload``: copy a finished local conversion to any fsspec URL, resumably.

Order of writes, so that a reader, who trusts only ``manifest.json``, never sees a partial
dataset: the run record (``convert.json``) claims the destination exactly as ``convert`` does;
a remote manifest is removed before anything else is sent; each shard's tar is sent and then,
once it is stored complete, its sidecar (shards in parallel threads); after a listing shows every
shard and sidecar at its size, the sidecar pack (``sidecars.pack``, rebuilt from the checked
sidecars), and the manifest last.

What counts as already there, so that a re-run after a kill sends only what is missing: a shard
whose remote tar has the sidecar's size and whose remote sidecar is byte-identical to the local
one. The sidecar holds the tar's sha256 and is only ever stored after its tar is complete, so
the pair vouches for the tar without reading it back: the check costs one listing of the
prefix plus one small read per shard, never a remote hash of shard bytes. (A run killed between
a tar and its sidecar sends that tar again.)

Before anything is sent the local metadata is checked as the loader checks it: the manifest
against its own ``manifest_sha256``, each sidecar against the sha256 the manifest records for
it and against the manifest's record (format 3). Before a shard is sent its local bytes are
hashed and compared with its sidecar: a corrupt or edited local file stops the upload with an
error naming it, and none of its bytes leave the machine.

Parallelism comes from shards sent side by side (``workers`` threads), each one part at a time,
so memory stays about ``workers`` x 50 MiB (s3fs's part size; a shard under 100 MiB goes in one
PUT read whole).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..exceptions import LeRobotShardsError
from ..format import MANIFEST_NAME, MAX_MANIFEST_BYTES, SHARDS_DIR, FormatError, Manifest, sidecar_digest
from ..redaction import without_credentials
from ..safe_io import check_local_file, read_sidecar, read_small
from .destination import HASH_CHUNK, RUN_RECORD, Destination, DestinationBusy, overlap
from .run import claim, refuse_lerobot_dataset

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 8
MAX_RUN_RECORD_BYTES = 16 * 1024 * 1024  # convert.json: options and arguments, a few KB
ShardSent = Callable[[str], None]  # receives a shard's name once its tar and sidecar are stored


class UploadError(LeRobotShardsError, RuntimeError):
    """The local conversion cannot be uploaded as it is, or the destination refused it."""


@dataclass(frozen=True)
class LocalShard:
    """One shard of the local conversion, as its sidecar describes it."""

    name: str
    sidecar_name: str
    tar: Path
    size: int
    sha256: str
    sidecar: bytes  # the sidecar file's bytes, sent as they are
    out: Path  # the conversion it belongs to: the tar must lie inside it


@dataclass(frozen=True)
class LocalPack:
    """``sidecars.pack`` as an upload sends it: joined from the checked sidecars, its sha256 the manifest's."""

    name: str
    data: bytes


@dataclass
class UploadSummary:
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    skipped_files: int = 0  # already at the destination with the same size and checksum
    skipped_bytes: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.uploaded_bytes / 1e6 / max(self.seconds, 1e-9)
        return (
            f"uploaded {self.uploaded_files} files ({self.uploaded_bytes / 1e6:.1f} MB), skipped {self.skipped_files} "
            f"already there ({self.skipped_bytes / 1e6:.1f} MB), in {self.seconds:.1f} s ({rate:.1f} MB/s)"
        )


def local_shards(out: Path, manifest: Manifest) -> list[LocalShard]:
    """The manifest's shards with their sidecars, each checked against the manifest first.

    A sidecar whose bytes differ from the sha256 the manifest records for it (format 3), or that
    describes another shard than the manifest's record, stops the upload before anything is
    sent: an UploadError naming the file.
    """
    shards = []
    fs = LocalFileSystem()
    for record in manifest.shards:
        path = out / SHARDS_DIR / record.sidecar
        try:
            sidecar, data = read_sidecar(fs, str(path), record, manifest, root=str(out), where=str(path))
        except FileNotFoundError:
            raise UploadError(f"{path}: missing; {out} is not a complete conversion") from None
        except FormatError as e:
            raise UploadError(f"{e}; nothing was uploaded") from None
        shards.append(
            LocalShard(
                record.name, record.sidecar, out / SHARDS_DIR / record.name, sidecar.size, sidecar.sha256, data, out
            )
        )
    return shards


def check_local_shard(shard: LocalShard) -> None:
    """Hash the local tar: an UploadError naming it unless it is a regular file inside the conversion (a
    FIFO would block, a symlink out of it send another file) whose size and sha256 match its sidecar."""
    try:
        check_local_file(str(shard.tar), root=str(shard.out))
    except FileNotFoundError:
        raise UploadError(f"{shard.tar}: missing; {shard.out} is not a complete conversion") from None
    except FormatError as e:
        raise UploadError(f"{e}; nothing of it was uploaded") from None
    h = hashlib.sha256()
    size = 0
    with open(shard.tar, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    if size != shard.size or h.hexdigest() != shard.sha256:
        raise UploadError(
            f"{shard.tar}: {size} bytes with sha256 {h.hexdigest()}, its sidecar says {shard.size} bytes with "
            f"sha256 {shard.sha256}: the local shard is corrupt and was not uploaded; re-run convert on its "
            f"dataset to rebuild it"
        )


def _rel(name: str) -> str:
    return posixpath.join(SHARDS_DIR, name)


def _already_there(dest: Destination, shard: LocalShard, remote_sizes: dict[str, int]) -> bool:
    if remote_sizes.get(shard.name) != shard.size or remote_sizes.get(shard.sidecar_name) != len(shard.sidecar):
        return False
    rel = _rel(shard.sidecar_name)
    return dest.retrying(f"{dest.url}/{rel}", lambda: dest.read_bytes(rel)) == shard.sidecar


class _Sender:
    """Sends shards (tar, then sidecar) from worker threads, feeding one byte progress bar."""

    def __init__(self, dest: Destination, bar: tqdm, on_sent: ShardSent | None) -> None:
        self.dest = dest
        self.bar = bar
        self.lock = threading.Lock()
        self.on_sent = on_sent

    def progress(self, n: int) -> None:
        with self.lock:
            self.bar.update(n)

    def send(self, shard: LocalShard) -> None:
        check_local_shard(shard)
        self.dest.put_file(str(shard.tar), _rel(shard.name), progress=self.progress, parts_at_once=1)
        self.dest.write_bytes(_rel(shard.sidecar_name), shard.sidecar)
        self.progress(len(shard.sidecar))
        log.debug("sent %s (%d bytes) and its sidecar", shard.name, shard.size)
        if self.on_sent is not None:
            self.on_sent(shard.name)


def read_conversion(out: Path) -> tuple[bytes, dict[str, Any], list[LocalShard], LocalPack | None]:
    """The finished conversion at ``out`` as an upload sends it: the manifest's bytes (checked against
    its own digest), the run record, the shards with their sidecars (``local_shards``) and the
    sidecar pack the manifest names (``local_pack``; None in older conversions). An UploadError
    naming the file when it is not a finished conversion; nothing is sent before this passes."""
    fs = LocalFileSystem()
    try:  # bounded reads of regular files: a FIFO or a symlink out of OUT is refused, not followed
        manifest_bytes = read_small(fs, str(out / MANIFEST_NAME), MAX_MANIFEST_BYTES, root=str(out))
        record = json.loads(read_small(fs, str(out / RUN_RECORD), MAX_RUN_RECORD_BYTES, root=str(out)))
        manifest = Manifest.from_json(manifest_bytes, where=str(out / MANIFEST_NAME))  # checks manifest_sha256
    except FileNotFoundError as e:
        raise UploadError(
            f"{e.filename}: missing; {out} is not a finished conversion (run convert to the end, or convert --finalize)"
        ) from None
    except json.JSONDecodeError as e:
        raise UploadError(f"{out / RUN_RECORD}: not JSON ({e})") from None
    except FormatError as e:
        raise UploadError(f"{e}; nothing was uploaded") from None
    shards = local_shards(out, manifest)
    return manifest_bytes, record, shards, local_pack(out, manifest, shards)


def local_pack(out: Path, manifest: Manifest, shards: list[LocalShard]) -> LocalPack | None:
    """``sidecars.pack`` rebuilt from the sidecars already checked (the local file is not read, so an
    edited one is not sent), refused unless it matches the size and sha256 the manifest records."""
    if manifest.sidecar_pack is None:
        return None
    data = b"".join(s.sidecar for s in shards)
    if len(data) != manifest.sidecar_pack.bytes or sidecar_digest(data) != manifest.sidecar_pack.sha256:
        raise UploadError(
            f"{out / manifest.sidecar_pack.name}: the sidecars joined do not match the size and sha256 the manifest "
            "records for the pack; nothing was uploaded"
        )
    return LocalPack(manifest.sidecar_pack.name, data)


def upload_dataset(
    out: str | Path,
    url: str,
    *,
    workers: int = DEFAULT_WORKERS,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_shard_sent: ShardSent | None = None,
) -> UploadSummary:
    """Upload the finished conversion at ``out`` to ``url`` (any fsspec URL); returns what was sent and skipped.

    Re-running resumes: shards already at ``url`` are skipped. ``url`` must be empty, hold this
    same conversion (its ``convert.json``), or ``overwrite`` must be given.
    ``on_shard_sent(name)`` is called from the sending thread once a shard's tar and sidecar are
    both stored (progress reporting; a test stops an upload at a known point through it).
    """
    start = time.monotonic()
    out = Path(out)
    manifest_bytes, record, shards, pack = read_conversion(out)

    dest = Destination(url, storage_options=storage_options)
    _refuse_upload_into_itself(out, dest)
    refuse_lerobot_dataset(dest)  # before the lock: nothing is written there
    try:
        with dest.lock(None):  # a local destination: no convert or upload writes there meanwhile
            return _upload(
                out, dest, manifest_bytes, record, shards, pack, workers, overwrite, progress, start, on_shard_sent
            )
    except DestinationBusy as e:
        raise UploadError(str(e)) from None


def _refuse_upload_into_itself(out: Path, dest: Destination) -> None:
    """Refuse a destination that is the conversion, lies inside it or holds it: the upload would
    write into (or with ``--overwrite`` clear) the very files it sends."""
    relation = overlap(dest.fs, dest.root, LocalFileSystem(), str(out.absolute()))
    if relation is not None:
        raise UploadError(
            f"{without_credentials(dest.url)}: {relation} the conversion {out} being uploaded; refusing to "
            "upload there (nothing was written): choose a destination outside it"
        )


def _upload(
    out: Path,
    dest: Destination,
    manifest_bytes: bytes,
    record: dict[str, Any],
    shards: list[LocalShard],
    pack: LocalPack | None,
    workers: int,
    overwrite: bool,
    progress: bool,
    start: float,
    on_shard_sent: ShardSent | None,
) -> UploadSummary:
    claim(dest, record, overwrite=overwrite)
    remote_sizes = dest.sizes(SHARDS_DIR)
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="upload") as pool:
        present = list(pool.map(lambda s: _already_there(dest, s, remote_sizes), shards))
    todo = [s for s, there in zip(shards, present) if not there]
    summary = UploadSummary()
    for s, there in zip(shards, present):
        if there:
            summary.skipped_files += 2
            summary.skipped_bytes += s.size + len(s.sidecar)
    manifest_there = dest.exists(MANIFEST_NAME) and dest.read_bytes(MANIFEST_NAME) == manifest_bytes
    manifest_there &= pack is None or (dest.exists(pack.name) and dest.size(pack.name) == len(pack.data))
    if not todo and manifest_there:
        summary.skipped_files += 1
        summary.skipped_bytes += len(manifest_bytes)
        summary.seconds = time.monotonic() - start
        log.info("%s already holds all of %s: %s", dest.url, out, summary)
        return summary
    log.info(
        "%s: %d of %d shards to send (%.1f MB), %d already there",
        dest.url,
        len(todo),
        len(shards),
        sum(s.size for s in todo) / 1e6,
        len(shards) - len(todo),
    )
    if todo:
        dest.remove(MANIFEST_NAME)  # readers must not see the manifest while its shards change
    _send(dest, todo, workers=workers, progress=progress, on_shard_sent=on_shard_sent)
    summary.uploaded_files += 2 * len(todo)
    summary.uploaded_bytes += sum(s.size + len(s.sidecar) for s in todo)

    missing = _missing(dest, shards)
    if missing:
        raise UploadError(f"{dest.url}: after the upload {len(missing)} objects are missing or short: {missing[:5]}")
    if pack is not None:  # before the manifest: a reader who sees the manifest finds the pack
        dest.write_bytes(pack.name, pack.data)
        summary.uploaded_files += 1
        summary.uploaded_bytes += len(pack.data)
    dest.write_bytes(MANIFEST_NAME, manifest_bytes)
    summary.uploaded_files += 1
    summary.uploaded_bytes += len(manifest_bytes)
    summary.seconds = time.monotonic() - start
    log.info("uploaded %s to %s: %s", out, dest.url, summary)
    return summary


def _send(
    dest: Destination, todo: list[LocalShard], *, workers: int, progress: bool, on_shard_sent: ShardSent | None
) -> None:
    """Send the shards in ``workers`` threads; on the first failure the rest are cancelled and it is raised."""
    total = sum(s.size + len(s.sidecar) for s in todo)
    bar = tqdm(
        total=total, unit="B", unit_scale=True, desc="upload", disable=not progress or not todo, dynamic_ncols=True
    )
    sender = _Sender(dest, bar, on_shard_sent)
    with logging_redirect_tqdm(), bar, ThreadPoolExecutor(max(1, workers), thread_name_prefix="upload") as pool:
        futures = [pool.submit(sender.send, s) for s in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()  # the pending ones; those in flight finish as the pool closes
    errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    if errors:
        raise errors[0]


def _missing(dest: Destination, shards: list[LocalShard]) -> list[str]:
    """Names of tars and sidecars not at the destination with their local size (one listing)."""
    sizes = dest.sizes(SHARDS_DIR)
    missing = []
    for s in shards:
        for name, size in ((s.name, s.size), (s.sidecar_name, len(s.sidecar))):
            if sizes.get(name) != size:
                missing.append(name)
    return missing
