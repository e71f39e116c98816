"""Datasets on the Hugging Face Hub: repo ids resolved as LeRobot resolves them, read through fsspec.

Imported only when a source is a Hub one (``filesystems.resolve_source`` for a repo id,
``filesystems.url_to_fs`` for an ``hf://`` URL): ``huggingface_hub`` is needed then, not otherwise.

A repo id (``lerobot/pusht``) becomes ``hf://datasets/lerobot/pusht@<commit>``: the revision is the
one asked for, or by default the codebase-version tag as LeRobot 0.6.1 picks it
(``datasets/utils.py:get_safe_version``: exactly ``v3.0``, else the newest ``v3.x`` tag or branch
with a lower minor), pinned to its commit so that every rank, worker and resume reads the same
bytes even if the tag moves. ``hf://`` URLs are read as written (no ``@revision``: ``main``, as
``HfFileSystem`` reads them).

``HubFileSystem`` is ``huggingface_hub.HfFileSystem`` with every request it makes for a dataset
repo bounded: the client's own requests have no timeout (a Hub that stops answering holds a
listing forever), and its repo-info request is never retried (one HTTP 500 failed a whole job).
Here each request has a timeout, failures (timeouts, dropped connections, 408, 429, 5xx) are
retried with exponential backoff that honours ``Retry-After``, and each call gives up within its
deadline with one line naming the Hub. The whole repo tree is listed once per process (one paginated recursive listing) and kept for
every instance's ``dircache``; DataLoader workers forked from the process that opened the dataset
inherit it and list nothing (a spawned worker lists once more). ``cat_file`` with a range
is one ranged GET (fsspec's default reads a 5 MB read-ahead block). Storage buckets
(``hf://buckets/<namespace>/<bucket>/...``, a dataset's ``data_files_root`` say) get the same: the
bucket's existence, its listing (the prefix first asked for, recursively, once per process: a later
path under it lists nothing) and every ranged read are bounded and retried the same way.

The token comes from where ``huggingface_hub`` looks (``HF_TOKEN``, the stored login of ``hf auth
login``) or the storage option ``token``; it is registered with ``redaction`` and never written
into a URL, manifest, record, log or message. ``HF_ENDPOINT`` is read when a file system is made
(``huggingface_hub.constants`` reads it once, at import), so a test or benchmark can point
everything at a server it started.
"""

from __future__ import annotations

import email.utils
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from huggingface_hub import HfFileSystem, constants, get_token
from huggingface_hub.errors import EntryNotFoundError
from huggingface_hub.hf_file_system import (
    HfFileSystemFile,
    HfFileSystemResolvedBucketPath,
    HfFileSystemResolvedRepositoryPath,
)
from huggingface_hub.utils import build_hf_headers, get_session

from ..exceptions import LeRobotShardsError
from ..names import UnsafeNameError, check_relpath
from ..redaction import register_secrets

CODEBASE_VERSION = "v3.0"  # the LeRobot dataset format this package reads
REQUEST_TIMEOUT_S = 10.0  # connect and longest silence within one response (storage option ``timeout``)
DEADLINE_S = 60.0  # one call, retries and their waits included (storage option ``deadline``)
FIRST_BACKOFF_S = 0.5  # then doubled, at most MAX_BACKOFF_S; a Retry-After header wins
MAX_BACKOFF_S = 8.0
# Blocks an open file keeps: FFmpeg reads an mp4's start, its index at the end, then the frames (and
# seeks back to them), so a single read-ahead range (HfFileSystemFile's) fetched the same bytes again
# at every turn; 16 blocks hold a whole camera file of the usual sizes.
FILE_BLOCKS = 16
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# The HTTP client's failures worth another try, by class name: huggingface_hub 2.x uses httpx2,
# 1.x (LeRobot 0.6.1's environment) httpx, with the same exception classes.
RETRIED_ERRORS = frozenset({"TimeoutException", "NetworkError", "RemoteProtocolError"})
INVALID_TOKEN = "Invalid credentials in Authorization header"  # the Hub's X-Error-Message for a bad token
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")


class HubError(LeRobotShardsError, OSError):
    """The Hub could not give what was asked; the message names the repo or file and what to do."""


class HubListingError(HubError):
    """A tree listing the Hub sent is not one: an entry outside the repo, a size that is no size."""


class HubUnavailable(HubError, TimeoutError):
    """No answer (or only failures and rate limits) from the Hub within the deadline."""


class HubAuthError(HubError, PermissionError):
    """The Hub refused the token (never printed: the message says where it came from)."""


class HubNotFound(HubError, FileNotFoundError):
    """No such repo, revision or file (or a private repo the token may not read)."""


def endpoint() -> str:
    """The Hub's URL: ``HF_ENDPOINT`` as set now, else huggingface_hub's (read at its import)."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def token_origin(token: Any) -> str:
    """Where the token came from, for messages (the token itself never is)."""
    if isinstance(token, str):
        return "the token in storage_options"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(name):
            return name
    return "the stored login (hf auth login)"


def parse_version(name: str) -> tuple[int, int, int] | None:
    """``v3.0`` -> (3, 0, 0); None for what ``packaging`` would not read as a plain version (``main``)."""
    m = _VERSION.match(name.strip())
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def safe_version(repo_id: str, refs: Mapping[str, Any], target: str) -> str:
    """The revision LeRobot 0.6.1's ``get_safe_version`` picks among ``refs`` (branch and tag names):
    ``target`` itself, else the newest with its major and a minor not above its own; anything else
    is refused naming what the repo has."""
    wanted = parse_version(target)
    assert wanted is not None
    versions = {v: name for name in refs if (v := parse_version(name)) is not None}
    if not versions:
        raise HubNotFound(
            f"{repo_id}: the repo has no version tag (LeRobot tags a dataset with its codebase version, e.g. "
            f"{CODEBASE_VERSION}); pass a revision (a branch or commit) or tag it"
        )
    if wanted in versions:
        return versions[wanted]
    compatible = [v for v in versions if v[0] == wanted[0] and v[1] <= wanted[1]]
    if compatible:
        return versions[max(compatible)]
    have = ", ".join(versions[v] for v in sorted(versions))
    raise HubNotFound(
        f"{repo_id}: no revision compatible with {target} (the repo has {have}); a v2.x dataset needs LeRobot's "
        "v2.1-to-v3.0 conversion, or pass revision= explicitly"
    )


# Complete repo listings of this process, by (endpoint, root): every instance (HfFileSystem makes one
# per thread) and every forked DataLoader worker reads them instead of listing again.
_listings: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
_listings_lock = threading.Lock()
# Bucket folders opened as a source or data files root (``filesystem_for``), by (endpoint, path): a
# listing of a path inside one lists the whole folder, once, instead of each sub-folder asked for.
_bucket_roots: set[tuple[str, str]] = set()
# Commits found to exist, by (endpoint, repo type, repo id, commit), for every instance of the process.
_found: set[tuple[str, str, str, str | None]] = set()
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# The metadata files every reader of a LeRobot dataset reads right after the listing, fetched together
# as soon as the listing names them (one round trip instead of one each, in turn), by (endpoint, hf://
# name) with the listing's root: they are used while that listing is (forgetting it forgets them).
METADATA = re.compile(r"^meta/(info\.json|stats\.json|tasks\.parquet|episodes/chunk-\d+/file-\d+\.parquet)$")
METADATA_MAX_BYTES = 64 << 20  # a larger file is read when asked for, as any other
_metadata: dict[tuple[str, str], tuple[str, Future[bytes]]] = {}


def _after_fork() -> None:
    """A child forked while another thread held the lock would wait on it forever: a new one. A
    metadata fetch still in flight has no thread in the child: it is dropped (read again if asked)."""
    global _listings_lock
    _listings_lock = threading.Lock()
    for key in [k for k, (_, f) in _metadata.items() if not f.done()]:
        del _metadata[key]


os.register_at_fork(after_in_child=_after_fork)


class HubFileSystem(HfFileSystem):
    """``HfFileSystem`` whose dataset-repo requests are bounded and retried, its tree listed once.

    Extra storage options: ``timeout`` (seconds per request) and ``deadline`` (seconds per call).
    """

    def __init__(self, *args: Any, timeout: float = REQUEST_TIMEOUT_S, deadline: float = DEADLINE_S, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.request_timeout = float(timeout)
        self.deadline = float(deadline)
        register_secrets({"token": self.token if isinstance(self.token, str) else get_token()})

    # -- requests ----------------------------------------------------------------------------------

    def request(self, method: str, url: str, where: str, **kwargs: Any) -> Any:
        """One Hub request, retried with backoff (``Retry-After`` honoured) until it succeeds or the
        deadline passes; errors become one-line ``HubError``s naming ``where``."""
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            raise HubUnavailable(
                f"{where}: HF_HUB_OFFLINE is set, so the Hub is not asked; unset it or give a local copy"
            )
        headers = {**build_hf_headers(token=self.token), **kwargs.pop("headers", {})}
        give_up = time.monotonic() + self.deadline
        backoff, tries, last = FIRST_BACKOFF_S, 0, ""
        while True:
            tries += 1
            wait = None
            try:
                response = get_session().request(
                    method, url, headers=headers, timeout=self.request_timeout, follow_redirects=True, **kwargs
                )
            except Exception as e:
                kinds = {t.__name__ for t in type(e).__mro__}
                if not kinds & RETRIED_ERRORS:
                    raise
                last = "no answer" if "TimeoutException" in kinds else f"connection failed ({type(e).__name__})"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUS:
                    raise self._refused(response, where)
                last = f"HTTP {response.status_code}"
                wait = _retry_after(response.headers.get("Retry-After"))
            wait = backoff if wait is None else wait
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            if time.monotonic() + wait >= give_up:
                raise HubUnavailable(
                    f"{where}: the Hugging Face Hub did not serve it within {self.deadline:.0f} s ({tries} tries, "
                    f"last: {last}); check the Hub's status or HF_ENDPOINT and your network, then retry"
                )
            time.sleep(wait)

    def _refused(self, response: Any, where: str) -> HubError:
        code = response.headers.get("X-Error-Code", "")
        message = response.headers.get("X-Error-Message", "")
        if response.status_code == 401 and message == INVALID_TOKEN:
            return HubAuthError(
                f"{where}: authentication error: the Hub refused the token from {token_origin(self.token)}; "
                "check it or log in again (hf auth login)"
            )
        bucket = where.startswith("hf://buckets/")
        if code == "RepoNotFound" or response.status_code == 401:
            return HubNotFound(
                f"{where}: no such {'bucket' if bucket else 'dataset repo'} on the Hub, or it is private or gated and "
                f"{'no token was given (set HF_TOKEN or hf auth login)' if not self._has_token() else 'the token may not read it'}"
            )
        if code == "RevisionNotFound":
            return HubNotFound(f"{where}: no such revision in the repo (a branch, tag or commit)")
        if code == "EntryNotFound" or response.status_code == 404:
            return HubNotFound(f"{where}: no such file in the {'bucket' if bucket else 'repo'}")
        if response.status_code == 403:
            return HubAuthError(f"{where}: the Hub forbids it (HTTP 403: {message}); check the token's permissions")
        return HubError(f"{where}: the Hub refused the request (HTTP {response.status_code} {message})".rstrip())

    def _has_token(self) -> bool:
        return bool(self.token if isinstance(self.token, str) else self.token is not False and get_token())

    def _api_url(self, repo_id: str, *parts: str) -> str:
        return f"{self.endpoint}/api/datasets/{repo_id}/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)

    def refs(self, repo_id: str) -> dict[str, str]:
        """Branch and tag names of a dataset repo -> their commits."""
        data = self.request("GET", self._api_url(repo_id, "refs"), repo_id).json()
        return {r["name"]: r["targetCommit"] for kind in ("branches", "tags") for r in data.get(kind) or ()}

    def commit(self, repo_id: str, revision: str) -> str:
        """The commit a revision (branch, tag or commit) of a dataset repo names."""
        where = f"{repo_id}@{revision}"
        return str(self.request("GET", self._api_url(repo_id, "revision", revision), where).json()["sha"])

    # -- HfFileSystem, bounded ---------------------------------------------------------------------

    def _repo_and_revision_exist(
        self, repo_type: str, repo_id: str, revision: str | None
    ) -> tuple[bool, Exception | None]:
        if repo_type != "dataset":
            return super()._repo_and_revision_exist(repo_type, repo_id, revision)
        key = (repo_type, repo_id, revision)
        if (self.endpoint, *key) in _found:  # found by another instance (thread) of this process
            self._repo_and_revision_exists_cache[key] = True, None
        if key not in self._repo_and_revision_exists_cache:
            try:
                self.commit(repo_id, revision or constants.DEFAULT_REVISION)
            except HubNotFound as e:
                self._repo_and_revision_exists_cache[key] = False, e
            else:
                self._repo_and_revision_exists_cache[key] = True, None
                if revision is not None and _COMMIT.match(revision):  # a commit never moves: kept for every instance
                    _found.add((self.endpoint, *key))
        return self._repo_and_revision_exists_cache[key]

    def _bucket_exists(self, bucket_id: str) -> tuple[bool, Exception | None]:
        key = ("bucket", bucket_id, None)
        if (self.endpoint, *key) in _found:
            self._bucket_exists_cache[bucket_id] = True, None
        if bucket_id not in self._bucket_exists_cache:  # a missing one raises our HubNotFound, which names it
            self.request("GET", f"{self.endpoint}/api/buckets/{bucket_id}", f"hf://buckets/{bucket_id}")
            self._bucket_exists_cache[bucket_id] = True, None
            _found.add((self.endpoint, *key))
        return self._bucket_exists_cache[bucket_id]

    def _ls_tree(
        self,
        path: str,
        recursive: bool = False,
        refresh: bool = False,
        revision: str | None = None,
        expand_info: bool | None = None,
        maxdepth: int | None = None,
    ) -> Any:
        resolved = self.resolve_path(path, revision=revision)
        if isinstance(resolved, HfFileSystemResolvedBucketPath):
            self._list_bucket(resolved, refresh)
            if resolved.unresolve() not in self.dircache:  # a file or nothing: HfFileSystem.ls asks the parent
                raise EntryNotFoundError(resolved.unresolve())
            return super()._ls_tree(path, recursive, False, revision, expand_info, maxdepth)
        if (
            not isinstance(resolved, HfFileSystemResolvedRepositoryPath)
            or resolved.repo_type != "dataset"
            or expand_info
        ):
            return super()._ls_tree(path, recursive, refresh, revision, expand_info, maxdepth)
        self._list_repo(resolved, refresh)
        if resolved.unresolve() not in self.dircache:  # a file or nothing: HfFileSystem.ls asks the parent
            raise EntryNotFoundError(resolved.unresolve())
        return super()._ls_tree(path, recursive, False, revision, expand_info, maxdepth)

    def _list_repo(self, resolved: HfFileSystemResolvedRepositoryPath, refresh: bool) -> None:
        """The whole tree of the repo at this revision into ``dircache``: one paginated listing."""
        root = resolved.root
        with _listings_lock:
            if (self.endpoint, root) in _listings and not refresh:
                self.dircache.update(_listings[self.endpoint, root])
                return
            where = f"{resolved.repo_id}@{resolved.revision}"
            url: str | None = self._api_url(resolved.repo_id, "tree", resolved.revision)
            params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
            listings: dict[str, list[dict[str, Any]]] = {root: []}
            entries = []
            while url is not None:
                response = self.request("GET", url, where, params=params)
                entries += _listed(response, where)
                url, params = response.links.get("next", {}).get("url"), None  # the next link has the query
            for entry in entries:
                if entry.get("type") == "directory":
                    listings.setdefault(f"{root}/{entry['path']}", [])
            for entry in entries:
                name = f"{root}/{entry['path']}"
                if entry.get("type") == "directory":
                    info = {
                        "name": name,
                        "size": 0,
                        "type": "directory",
                        "tree_id": entry.get("oid"),
                        "last_commit": None,
                    }
                else:
                    info = {
                        "name": name,
                        "size": int(entry["size"]),
                        "type": "file",
                        "blob_id": entry.get("oid"),
                        "lfs": entry.get("lfs"),
                        "xet_hash": None,  # read over HTTP ranges, never through xet
                        "last_commit": None,
                        "security": None,
                    }
                listings.setdefault(self._parent(name), []).append(info)
            for key in [k for k in self.dircache if k == root or k.startswith(root + "/")]:
                del self.dircache[key]
            self.dircache.update(listings)
            _listings[self.endpoint, root] = listings
            self._fetch_metadata(root, entries)

    def _fetch_metadata(self, root: str, entries: list[dict[str, Any]]) -> None:
        """Start fetching the repo's LeRobot metadata files at once (``METADATA``), for ``read_range``."""
        wanted = [
            f"{root}/{e['path']}"
            for e in entries
            if e.get("type") == "file" and METADATA.match(e["path"]) and int(e["size"]) <= METADATA_MAX_BYTES
        ]
        if not wanted:
            return
        pool = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="hub-metadata")
        for path in wanted:
            url, where = self.resolve_url(path)
            fetch = pool.submit(self._content, url, where)
            _metadata[self.endpoint, where] = root, fetch
        pool.shutdown(wait=False)

    def _content(self, url: str, where: str) -> bytes:
        return bytes(self.request("GET", url, where).content)

    def _list_bucket(self, resolved: HfFileSystemResolvedBucketPath, refresh: bool) -> None:
        """Everything under the bucket path into ``dircache``: one paginated recursive listing of its
        prefix, unless a listing of this process already covers it."""
        top = resolved.unresolve()
        roots = [r for e, r in _bucket_roots if e == self.endpoint and top.startswith(r + "/")]
        if roots:  # a folder inside a source opened here: the source's whole folder, listed once
            top = max(roots, key=len)
            root = self.resolve_path(top)
            assert isinstance(root, HfFileSystemResolvedBucketPath)
            resolved = root
        with _listings_lock:
            covering = [k for k in _listings if k[0] == self.endpoint and (top == k[1] or top.startswith(k[1] + "/"))]
            if covering and not refresh:
                self.dircache.update(_listings[covering[0]])
                return
            where = f"hf://{top}"
            prefix = resolved.path.strip("/")
            url: str | None = f"{self.endpoint}/api/buckets/{resolved.bucket_id}/tree" + (
                "/" + urllib.parse.quote(prefix, safe="") if prefix else ""
            )
            params: dict[str, str] | None = {"recursive": "true"}
            entries = []
            while url is not None:
                response = self.request("GET", url, where, params=params)
                entries += _listed(response, where)
                url, params = response.links.get("next", {}).get("url"), None
            listings: dict[str, list[dict[str, Any]]] = {}
            files = [e for e in entries if e.get("type") == "file"]
            files = [e for e in files if not prefix or e["path"] == prefix or e["path"].startswith(prefix + "/")]
            if any(e["path"] != prefix for e in files) or not files:
                listings[top] = []  # a folder (or nothing: HfFileSystem's empty listing)
            folders: set[str] = set()
            for entry in files:
                name = f"{resolved.root}/{entry['path']}"
                folder = self._parent(name)
                while folder != top and folder.startswith(top + "/") and folder not in folders:  # its folders
                    folders.add(folder)
                    listings.setdefault(folder, [])
                    listings.setdefault(self._parent(folder), []).append(
                        {"name": folder, "size": 0, "type": "directory", "uploaded_at": None}
                    )
                    folder = self._parent(folder)
                listings.setdefault(self._parent(name), []).append(
                    {
                        "name": name,
                        "size": int(entry["size"]),
                        "type": "file",
                        "xet_hash": None,  # read over HTTP ranges, never through xet
                        "mtime": None,
                        "uploaded_at": None,
                    }
                )
            for key in [k for k in self.dircache if k == top or k.startswith(top + "/")]:
                del self.dircache[key]
            self.dircache.update(listings)
            _listings[self.endpoint, top] = listings

    def resolve_url(self, path: str) -> tuple[str, str]:
        """(the file's ``resolve`` URL, ``hf://`` name for messages) of a dataset repo or bucket file."""
        resolved = self.resolve_path(path)
        if isinstance(resolved, HfFileSystemResolvedBucketPath):
            url = f"{self.endpoint}/buckets/{resolved.bucket_id}/resolve/{urllib.parse.quote(resolved.path)}"
            return url, f"hf://{resolved.unresolve()}"
        assert isinstance(resolved, HfFileSystemResolvedRepositoryPath)
        url = (
            f"{self.endpoint}/datasets/{resolved.repo_id}/resolve/"
            f"{urllib.parse.quote(resolved.revision, safe='')}/{urllib.parse.quote(resolved.path_in_repo)}"
        )
        return url, f"hf://{resolved.unresolve()}"

    def read_range(self, path: str, start: int | None, end: int | None) -> bytes:
        """Bytes [start, end) of a file in one (ranged) GET, their count checked."""
        url, where = self.resolve_url(path)
        root, fetched = _metadata.get((self.endpoint, where), ("", None))
        if fetched is not None and (self.endpoint, root) in _listings and fetched.exception() is None:
            return fetched.result()[start:end]  # a failed fetch is asked again below, and fails there
        if start is None and end is None:
            return self.request("GET", url, where).content
        size = int(self.info(path)["size"])
        start = 0 if start is None else start + size if start < 0 else start
        end = size if end is None else end + size if end < 0 else min(end, size)
        if start >= end:
            return b""
        response = self.request("GET", url, where, headers={"Range": f"bytes={start}-{end - 1}"})
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total.isdigit() and int(total) != size:  # the listing lied about the size: reads past it, or short
            raise HubListingError(f"{where}: the Hub's tree listing gives {size} bytes, its answer {total}; retry")
        data = response.content
        if len(data) != end - start:
            raise HubError(f"{where}: the Hub sent {len(data)} bytes for a range of {end - start}; read it again")
        return data

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if not self._is_repo_path(path):
            return super().cat_file(path, start=start, end=end, **kwargs)
        return self.read_range(path, start, end)

    def exists(self, path: str, **kwargs: Any) -> bool:
        """HfFileSystem's, except that a Hub that did not answer or refused the token is said so,
        not taken for a missing file ("neither a converted dataset nor a LeRobot dataset")."""
        try:
            self.info(path, **kwargs)
        except (HubUnavailable, HubAuthError, HubListingError):
            raise
        except OSError:
            return False
        return True

    def _is_repo_path(self, path: str) -> bool:
        """A dataset repo's or a bucket's file: read by our bounded ranged GETs."""
        resolved = self.resolve_path(path)
        if isinstance(resolved, HfFileSystemResolvedBucketPath):
            return True
        return isinstance(resolved, HfFileSystemResolvedRepositoryPath) and resolved.repo_type == "dataset"

    def _open(
        self, path: str, mode: str = "rb", block_size: int | None = None, revision: str | None = None, **kwargs: Any
    ) -> Any:
        if mode != "rb" or revision is not None or block_size == 0 or not self._is_repo_path(path):
            return super()._open(path, mode, block_size, revision, **kwargs)
        block_size = block_size if block_size is not None else self.block_size
        if block_size is not None:
            kwargs["block_size"] = block_size
        kwargs.setdefault("cache_type", "blockcache")
        kwargs.setdefault("cache_options", {"maxblocks": FILE_BLOCKS})
        return HubFile(self, path, mode=mode, **kwargs)


class HubFile(HfFileSystemFile):
    """A dataset-repo or bucket file read by bounded ranged GETs."""

    fs: HubFileSystem

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.read_range(self.path, start, end)


def _listed(response: Any, where: str) -> list[dict[str, Any]]:
    """A page of a tree listing, each entry checked: a file or folder whose path stays inside the
    repo or bucket (no ``..``, no leading ``/``), a file's size a whole number >= 0. A Hub (or a
    proxy) answering otherwise is one error naming the repo and the entry, not a bare KeyError
    or a misleading "not a readable mp4" later, and no listed name leads out of the repo."""
    try:
        page = response.json()
    except ValueError:
        page = None
    if not isinstance(page, list):
        raise HubListingError(f"{where}: the Hub's tree listing is not a list of entries; retry, or check HF_ENDPOINT")
    for entry in page:
        path = entry.get("path") if isinstance(entry, dict) else None
        try:
            check_relpath(path, "path")
        except UnsafeNameError as e:
            raise HubListingError(f"{where}: the Hub's tree listing names a path outside it ({e})") from None
        kind, size = entry.get("type"), entry.get("size")
        if kind not in ("file", "directory"):
            raise HubListingError(
                f"{where}: the Hub's tree listing gives {path} the type {kind!r}, not file or directory"
            )
        if kind == "file" and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise HubListingError(
                f"{where}: the Hub's tree listing gives {path} the size {size!r}, not a whole number >= 0"
            )
    return page


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (a number or an HTTP date); None without one."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def filesystem(storage_options: Mapping[str, Any] | None = None) -> HubFileSystem:
    """The Hub file system for these storage options, at ``HF_ENDPOINT`` as set now.

    The endpoint is passed explicitly: fsspec caches instances by their arguments, and
    HfFileSystem fills a missing one with the endpoint of import time (another server's).
    """
    return HubFileSystem(**{"endpoint": endpoint(), **dict(storage_options or {})})


def filesystem_for(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[HubFileSystem, str]:
    """(the Hub file system, the path in it) of an ``hf://`` URL that names a dataset (or its data
    files): a bucket folder is remembered as one to list whole."""
    fs = filesystem(storage_options)
    path = str(fs._strip_protocol(url)).rstrip("/")
    if path.startswith("buckets/") and path.count("/") > 2:
        _bucket_roots.add((fs.endpoint, path))
    return fs, path


def repo_url(repo_id: str, revision: str | None = None, storage_options: Mapping[str, Any] | None = None) -> str:
    """``hf://datasets/<repo_id>@<commit>`` for a dataset repo id, the revision resolved as LeRobot
    does (a version such as ``v3.0``, or None for the codebase version: the tag ``get_safe_version``
    picks; a branch or commit: as given) and pinned to its commit."""
    fs = filesystem(storage_options)
    wanted = revision or CODEBASE_VERSION
    if parse_version(wanted) is not None:
        wanted = safe_version(repo_id, fs.refs(repo_id), wanted)
    commit = fs.commit(repo_id, wanted)
    _found.add((fs.endpoint, "dataset", repo_id, commit))  # opening the URL asks no more
    return f"hf://datasets/{repo_id}@{commit}"
