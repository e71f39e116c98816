"""``lerobot-shards upload OUT hf://datasets/<repo>`` (or ``OUT <repo_id>``): a finished conversion to a
Hub dataset repo through ``huggingface_hub``'s commit API, resumably, the manifest last.

Order of commits, so that a reader, who trusts only ``manifest.json``, never sees a manifest naming
a missing shard: the first commit claims the repo (``convert.json``) and, when shards are to be
sent, removes a manifest already there; then the shards go in commits of about ``commit_bytes``
each (tar and sidecar together); a listing then shows every shard at its sha256, and the last
commit adds the sidecar pack (``sidecars.pack``, rebuilt from the checked sidecars) and the
manifest. Each commit is atomic on the Hub: a kill leaves the commits made and
nothing of the one in flight but its LFS objects, which the Hub keeps by sha256.

What counts as already there, so that a re-run sends only what is missing: a tar listed with the
sidecar's size and sha256 (the LFS oid the Hub lists) beside a sidecar whose git blob id is the
local sidecar's: one recursive listing, no download. An LFS object of a killed commit is not sent
again either: the Hub's LFS batch answer offers no upload for an object it holds.

The token is ``huggingface_hub``'s (``HF_TOKEN``, else the stored login); it is never printed, and a
refusal names where it came from. With ``hf_xet`` installed the client sends file bytes by Xet
(its own choice, not the server's); without it (or with ``HF_HUB_DISABLE_XET=1``) by plain LFS,
which is the route tests/hub_server.py serves. A repo that does not exist is created private.

Bounded: ``huggingface_hub``'s HTTP client has no timeout, so a Hub that stops answering held an
upload forever. While an upload runs, every request of the client that sets no timeout of its own
gets ``timeout`` seconds of silence at most (connecting, sending a chunk, waiting for the answer;
not the whole transfer); past it, or on a dropped connection or a refusal, the upload ends in one
line naming the object being sent. The client retries an LFS PUT itself (5 more tries after
waits of 1, 2, 4, 8, 8 s), so a Hub that stops answering ends an upload within ``6 x timeout +
23`` s, and within ``timeout`` at any other request; run again, it resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..convert.destination import RUN_RECORD
from ..convert.upload import LocalShard, UploadError, UploadSummary, check_local_shard, read_conversion
from ..filesystems import hub_repo_id
from ..format import MANIFEST_NAME, SHARDS_DIR, SIDECAR_PACK_NAME
from .hub import endpoint, token_origin

log = logging.getLogger(__name__)

UPLOAD_TIMEOUT_S = 60.0  # a request's longest silence (the Hub may think a while before answering a large commit)
# The HTTP client's failures that mean no answer (a timeout, a dropped or refused connection), by class name
TRANSPORT_ERRORS = frozenset({"TimeoutException", "NetworkError", "RemoteProtocolError"})
DEFAULT_COMMIT_BYTES = 2 * 1024**3  # shards per commit: few commits (the Hub limits their rate), bounded loss
_HF_URL = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/?$")
HUB_TOP_FILES = (".gitattributes", "README.md")  # what a new Hub repo may hold besides a conversion


def hub_destination(url: str) -> tuple[str, str] | None:
    """``(repo_id, revision)`` when ``url`` names a Hub dataset repo (``hf://datasets/<repo>[@<rev>]``,
    or a repo id by the sources' rule: ``filesystems.hub_repo_id``), else None. A folder inside a
    repo is refused: a conversion is a whole repo."""
    if url.startswith("hf://"):
        m = _HF_URL.match(url)
        if m is None:
            raise UploadError(
                f"{url}: a Hub upload goes to a whole dataset repo, hf://datasets/<namespace>/<name>[@<branch>]"
            )
        return m["repo"], m["rev"] or "main"
    repo_id = hub_repo_id(url)
    return None if repo_id is None else (repo_id, "main")


def _blob_id(data: bytes) -> str:
    """Git's blob id of ``data``: what the Hub lists for a file it keeps in git (a sidecar, a record)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def upload_to_hub(
    out: str | Path,
    repo_id: str,
    revision: str = "main",
    *,
    overwrite: bool = False,
    commit_bytes: int = DEFAULT_COMMIT_BYTES,
    on_commit: Callable[[list[str]], None] | None = None,
    timeout: float = UPLOAD_TIMEOUT_S,
) -> UploadSummary:
    """Upload the finished conversion at ``out`` to dataset repo ``repo_id`` at branch ``revision``.

    The repo must be new or empty, hold this same conversion (its ``convert.json``), or
    ``overwrite`` must be given (its other shards and manifest are then removed with the last
    commit). ``on_commit(names)`` is called after each commit of shards with their names (a test
    stops an upload between commits through it). ``timeout``: a request's longest silence (see the
    module's docstring for what it bounds).
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    start = time.monotonic()
    out = Path(out)
    manifest_bytes, record, shards, pack = read_conversion(out)
    record_bytes = (out / RUN_RECORD).read_bytes()
    api = HfApi(endpoint=endpoint())
    where = f"hf://datasets/{repo_id}@{revision}"
    sending = where  # what the request in flight sends, named by a failure
    with _failures_named(lambda: sending, timeout), _silence_bound(timeout):
        api.create_repo(repo_id, repo_type="dataset", private=True, exist_ok=True)
        remote = _listing(api, repo_id, revision)
        stale = _claim(where, remote, record_bytes, shards, overwrite=overwrite)
        todo = [s for s in shards if not _already_there(remote, s)]
        summary = UploadSummary()
        for s in shards:
            if s not in todo:
                summary.skipped_files += 2
                summary.skipped_bytes += s.size + len(s.sidecar)
        manifest_there = remote.get(MANIFEST_NAME, {}).get("oid") == _blob_id(manifest_bytes)
        manifest_there &= pack is None or remote.get(pack.name, {}).get("size") == len(pack.data)
        if not todo and manifest_there and not stale:
            summary.skipped_files += 1
            summary.skipped_bytes += len(manifest_bytes)
            summary.seconds = time.monotonic() - start
            return summary
        log.info(
            "%s: %d of %d shards to send, %d already there", where, len(todo), len(shards), len(shards) - len(todo)
        )
        first: list[Any] = []
        if remote.get(RUN_RECORD, {}).get("oid") != _blob_id(record_bytes):
            first.append(CommitOperationAdd(RUN_RECORD, record_bytes))
        if todo and MANIFEST_NAME in remote:  # readers must not see the manifest while its shards change
            first.append(CommitOperationDelete(MANIFEST_NAME))
        if first:
            sending = f"{where}/{first[0].path_in_repo}"
            api.create_commit(
                repo_id, first, commit_message="lerobot-shards upload: claim", repo_type="dataset", revision=revision
            )
        for batch in _batches(todo, commit_bytes):
            operations: list[Any] = []
            for s in batch:
                check_local_shard(s)  # a corrupt local tar stops the upload before its bytes leave
                operations.append(CommitOperationAdd(f"{SHARDS_DIR}/{s.name}", str(s.tar)))
                operations.append(CommitOperationAdd(f"{SHARDS_DIR}/{s.sidecar_name}", s.sidecar))
            more = f" (and {len(batch) - 1} more shards in its commit)" if len(batch) > 1 else ""
            sending = f"{where}/{SHARDS_DIR}/{batch[0].name}{more}"
            api.create_commit(
                repo_id,
                operations,
                commit_message=f"lerobot-shards upload: {len(batch)} shards",
                repo_type="dataset",
                revision=revision,
            )
            summary.uploaded_files += 2 * len(batch)
            summary.uploaded_bytes += sum(s.size + len(s.sidecar) for s in batch)
            if on_commit is not None:
                on_commit([s.name for s in batch])
        sending = where
        remote = _listing(api, repo_id, revision)
        missing = [s.name for s in shards if not _already_there(remote, s)]
        if missing:  # a local file changed after its check, or the Hub lost a file: no manifest
            raise UploadError(f"{where}: after the upload {len(missing)} shards are missing or differ: {missing[:5]}")
        last: list[Any] = [CommitOperationDelete(p) for p in sorted(_stale(remote, shards))]
        if pack is not None:  # in the manifest's commit: no reader sees one without the other
            last.append(CommitOperationAdd(pack.name, pack.data))
        last.append(CommitOperationAdd(MANIFEST_NAME, manifest_bytes))
        sending = f"{where}/{MANIFEST_NAME}"
        api.create_commit(
            repo_id, last, commit_message="lerobot-shards upload: manifest", repo_type="dataset", revision=revision
        )
    summary.uploaded_files += 1
    summary.uploaded_bytes += len(manifest_bytes)
    summary.seconds = time.monotonic() - start
    return summary


@contextlib.contextmanager
def _failures_named(sending: Callable[[], str], timeout: float) -> Iterator[None]:
    """The Hub's refusals and the network's failures as one ``UploadError`` naming ``sending()``."""
    try:
        yield
    except Exception as e:
        kinds = {t.__name__ for t in type(e).__mro__}
        if "HfHubHTTPError" in kinds:
            raise _hub_error(sending(), e) from None
        if not kinds & TRANSPORT_ERRORS:
            raise
        why = (
            f"no answer within {timeout:g} s"
            if "TimeoutException" in kinds
            else f"connection failed: {type(e).__name__}"
        )
        raise UploadError(
            f"{sending()}: the Hugging Face Hub did not take it ({why}); nothing more was sent: check the Hub's "
            "status or HF_ENDPOINT and your network, then run the upload again (it resumes)"
        ) from None


@contextlib.contextmanager
def _silence_bound(timeout: float) -> Iterator[None]:
    """Every request of ``huggingface_hub``'s shared client that sets no timeout gets ``timeout`` s of
    silence at most while this runs (the client builds each request with none: ``timeout=None``)."""
    from huggingface_hub.utils import get_session

    bound = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}

    def hook(request: Any) -> None:
        if not any(request.extensions.get("timeout", {}).values()):
            request.extensions = {**request.extensions, "timeout": bound}

    hooks = get_session().event_hooks["request"]
    hooks.append(hook)
    try:
        yield
    finally:
        hooks.remove(hook)


def _listing(api: Any, repo_id: str, revision: str) -> dict[str, dict[str, Any]]:
    """``{path: {"size", "oid", "sha256"}}`` of the repo's files (one paginated recursive listing);
    ``sha256`` is the LFS oid of a file the Hub keeps in LFS, else None."""
    out = {}
    for entry in api.list_repo_tree(repo_id, repo_type="dataset", revision=revision, recursive=True):
        if getattr(entry, "blob_id", None) is None:
            continue  # a folder
        lfs = getattr(entry, "lfs", None)
        out[entry.path] = {"size": entry.size, "oid": entry.blob_id, "sha256": lfs.sha256 if lfs else None}
    return out


def _already_there(remote: dict[str, dict[str, Any]], shard: LocalShard) -> bool:
    tar = remote.get(f"{SHARDS_DIR}/{shard.name}")
    sidecar = remote.get(f"{SHARDS_DIR}/{shard.sidecar_name}")
    return (
        tar is not None
        and tar["size"] == shard.size
        and tar["sha256"] == shard.sha256
        and sidecar is not None
        and sidecar["oid"] == _blob_id(shard.sidecar)
    )


def _stale(remote: dict[str, dict[str, Any]], shards: list[LocalShard]) -> set[str]:
    """Files of the repo's shards folder that this conversion does not hold (another conversion's)."""
    ours = {f"{SHARDS_DIR}/{n}" for s in shards for n in (s.name, s.sidecar_name)}
    return {p for p in remote if p.startswith(f"{SHARDS_DIR}/") and p not in ours}


def _claim(
    where: str, remote: dict[str, dict[str, Any]], record_bytes: bytes, shards: list[LocalShard], *, overwrite: bool
) -> bool:
    """Check that the repo may take this conversion; True when another conversion's files are to go."""
    if any(p.startswith("meta/") for p in remote):
        raise UploadError(f"{where}: holds a LeRobot dataset (meta/); refusing to upload a conversion into it")
    theirs = remote.get(RUN_RECORD)
    if theirs is not None and theirs["oid"] != _blob_id(record_bytes) and not overwrite:
        raise UploadError(
            f"{where}/{RUN_RECORD}: the repo holds a conversion with other settings; pass --overwrite to replace "
            "it or choose another repo (nothing was uploaded)"
        )
    foreign = [
        p for p in remote if p not in (*HUB_TOP_FILES, RUN_RECORD, MANIFEST_NAME, SIDECAR_PACK_NAME) and "/" not in p
    ]
    foreign += [p for p in remote if "/" in p and not p.startswith(f"{SHARDS_DIR}/")]
    if theirs is None and foreign and not overwrite:
        raise UploadError(
            f"{where}: not empty and holds no {RUN_RECORD} ({', '.join(sorted(foreign)[:3])}), so it is not "
            "lerobot-shards output: refusing to upload into it (pass --overwrite, or choose another repo)"
        )
    return bool(_stale(remote, shards))


def _batches(todo: list[LocalShard], commit_bytes: int) -> Iterator[list[LocalShard]]:
    batch: list[LocalShard] = []
    size = 0
    for s in todo:
        if batch and size + s.size > commit_bytes:
            yield batch
            batch, size = [], 0
        batch.append(s)
        size += s.size
    if batch:
        yield batch


def _hub_error(where: str, e: Any) -> UploadError:
    """One line for a refused request: the status and the Hub's message, where the token came from on 401/403."""
    status = e.response.status_code if e.response is not None else None
    message = (e.server_message or "").strip().splitlines()[0] if getattr(e, "server_message", None) else ""
    if status in (401, 403):
        return UploadError(
            f"{where}: the Hub refused the token from {token_origin(None)} (HTTP {status}{': ' + message if message else ''});"
            " log in with `hf auth login` or set HF_TOKEN to a token that may write to the repo"
        )
    return UploadError(
        f"{where}: the Hub answered HTTP {status}{': ' + message if message else ''}; nothing more was sent"
    )
