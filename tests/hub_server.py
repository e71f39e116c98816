"""A loopback server speaking the parts of the Hugging Face Hub's HTTP API that ``huggingface_hub``
(2.x: ``HfApi``, ``HfFileSystem``, ``hf_hub_download``) and our Hub source use, for tests.

Registered from conftest.py via ``pytest_plugins``, like ``s3_server``. It serves local LeRobot
v3.0 folders as dataset repos on 127.0.0.1, with what the client checks:

- ``GET /api/datasets/{repo}/refs``: branches and tags (LeRobot resolves its codebase-version tag here);
- ``GET /api/datasets/{repo}[/revision/{rev}]``: repo info with the commit ``sha``;
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]``: a listing paginated by cursor with a ``Link: <..>;
  rel="next"`` header (``page_size`` entries a page), ``recursive=true`` for the whole subtree;
- ``POST /api/datasets/{repo}/paths-info/{rev}``: entries for the form's ``paths``;
- ``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}``: the file, ``Range`` answered with 206 (416
  when unsatisfiable), headers ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``/``X-Linked-Size`` for
  the files the Hub keeps in LFS (parquet, mp4), ``Content-Length``, ``Accept-Ranges``.

Storage buckets (``add_bucket``), as ``HfFileSystem`` and our Hub file system read them:

- ``GET /api/buckets/{bucket}``: bucket info;
- ``GET /api/buckets/{bucket}/tree[/{prefix}]``: files whose path starts with the prefix (lexically, as
  the Hub matches it), paginated as above; ``recursive=true``: files only, else files and folders one
  level down;
- ``HEAD``/``GET /buckets/{bucket}/resolve/{path}``: the file, ``Range`` as above (the real Hub
  redirects to its Xet bridge; the bytes are the same).

Writes, as ``HfApi.create_repo`` and ``create_commit`` make them on the plain LFS route (the client
takes it when ``hf_xet`` is off: ``huggingface_hub.constants.HF_HUB_DISABLE_XET``, which the
``hub_writes`` fixture sets; the choice is the client's, the server is never asked), each needing a
valid token:

- ``POST /api/repos/create``: a dataset repo with an empty ``main`` (409 when it exists);
- ``POST /api/datasets/{repo}/preupload/{rev}``: ``uploadMode`` ``lfs`` for ``.tar``, ``.parquet``,
  ``.mp4``, else ``regular``, with the ``oid`` of the file already at that path;
- ``POST /datasets/{repo}.git/info/lfs/objects/batch``: an ``upload`` action (a ``PUT`` to
  ``/lfs-objects/{oid}``) only for objects the server does not hold: a re-sent file is not sent
  again; the ``PUT``'s bytes must hash to the oid;
- ``POST /api/datasets/{repo}/commit/{rev}``: the ndjson commit (``file`` in base64, ``lfsFile`` by
  oid, which must have been sent, ``deletedFile``/``deletedFolder``), a new commit on the branch.

Errors as the Hub sends them (``X-Error-Code``/``X-Error-Message`` headers, which
``hf_raise_for_status`` reads): a missing or private repo without a token is 401 ``RepoNotFound``
(404 with a valid token that may not see it), a token the server does not know is 401 "Invalid
credentials in Authorization header", a missing revision 404 ``RevisionNotFound``, a missing file
404 ``EntryNotFound``. On demand: failures (``fail(status, times, path_contains, retry_after)``:
429 with ``Retry-After``, 5xx), a pause (``pause()``: requests are held unanswered, as by a Hub that
stopped answering, until ``resume()``), and shaping like the real Hub for benchmarks (per-request
latency, bandwidth, a request-rate limit answered with 429). Every request is logged
(``requests()``), so tests count what a client sent.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

LFS_SUFFIXES = (".parquet", ".mp4")  # what LeRobot datasets keep in LFS on the Hub
UPLOAD_LFS_SUFFIXES = (*LFS_SUFFIXES, ".tar")  # what an upload sends by LFS (preupload's answer)
INVALID_TOKEN = "Invalid credentials in Authorization header"
VALID_TOKEN = "hf_valid_test_token_0123456789"  # the token the test server accepts
HELD_MAX_S = 120.0  # a held request is released after this long even if the test forgot to resume


@dataclass
class _File:
    path: Path
    size: int
    oid: str  # git blob sha1
    sha256: str | None  # LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.oid

    def entry(self, rel: str) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": rel}
        if self.sha256:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return out


@dataclass
class _Commit:
    sha: str
    files: dict[str, _File]  # repo path -> file
    dirs: set[str]  # every folder's repo path ("" is the root)


@dataclass
class _Repo:
    repo_id: str
    private: bool
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    tags: dict[str, str] = field(default_factory=dict)

    def commit(self, revision: str) -> _Commit | None:
        sha = self.branches.get(revision) or self.tags.get(revision) or revision
        return self.commits.get(sha)


@dataclass
class _Bucket:
    bucket_id: str
    private: bool
    files: dict[str, _File] = field(default_factory=dict)  # bucket path -> file


@dataclass
class _Failure:
    status: int
    times: int
    path_contains: str
    retry_after: float | None


def _commit_of(files: dict[str, _File]) -> _Commit:
    """A commit holding ``files``: its sha from their paths and blob ids, its folders from their paths."""
    digest = hashlib.sha1()
    dirs = {""}
    for rel in sorted(files):
        digest.update(f"{rel}\0{files[rel].oid}\n".encode())
        parts = rel.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return _Commit(digest.hexdigest(), files, dirs)


def _blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _snapshot(folder: Path) -> _Commit:
    files: dict[str, _File] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        sha256 = hashlib.sha256(data).hexdigest() if rel.endswith(LFS_SUFFIXES) else None
        files[rel] = _File(path, len(data), _blob_oid(data), sha256)
    return _commit_of(files)


class HubServer:
    """The server's state; ``url`` is its endpoint (``HF_ENDPOINT``)."""

    def __init__(self, *, page_size: int = 1000, tokens: tuple[str, ...] = ()) -> None:
        self.page_size = page_size
        self.tokens = set(tokens)  # tokens the server accepts (any valid one may read private repos)
        self.latency_s = 0.0  # added before each answer
        self.bytes_per_s = 0.0  # 0: unlimited
        self.max_requests_per_s = 0.0  # 0: unlimited; beyond it 429 with Retry-After
        self._repos: dict[str, _Repo] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._failures: list[_Failure] = []
        self._log: list[tuple[str, str, int]] = []
        self._served: list[tuple[str, int]] = []  # (path, bytes) of each file GET answered
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._running.set()
        self._window: list[float] = []
        self._store = tempfile.TemporaryDirectory(prefix="hub-server-")  # uploaded objects and blobs
        self._objects: dict[str, _File] = {}  # LFS objects received, by sha256
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="hub-server", daemon=True)

    # -- set-up -------------------------------------------------------------------------------------

    def add_dataset(
        self,
        repo_id: str,
        folder: Path,
        *,
        branches: tuple[str, ...] = ("main",),
        tags: tuple[str, ...] = ("v3.0",),
        private: bool = False,
    ) -> str:
        """Serve ``folder`` as a commit of dataset repo ``repo_id`` that ``branches`` and ``tags``
        point to (a repo may get several commits); returns the commit sha."""
        commit = _snapshot(Path(folder))
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(repo_id, private))
            repo.private = private
            repo.commits[commit.sha] = commit
            repo.branches.update(dict.fromkeys(branches, commit.sha))
            repo.tags.update(dict.fromkeys(tags, commit.sha))
        return commit.sha

    def add_bucket(self, bucket_id: str, folder: Path, *, prefix: str = "", private: bool = False) -> None:
        """Put the files of ``folder`` into storage bucket ``bucket_id`` under ``prefix``."""
        files = _snapshot(Path(folder)).files
        with self._lock:
            bucket = self._buckets.setdefault(bucket_id, _Bucket(bucket_id, private))
            bucket.private = private
            bucket.files.update({"/".join(p for p in (prefix.strip("/"), rel) if p): f for rel, f in files.items()})

    def remove_from_bucket(self, bucket_id: str, path: str) -> None:
        with self._lock:
            del self._buckets[bucket_id].files[path]

    def fail(self, status: int, *, times: int = 1, path_contains: str = "", retry_after: float | None = None) -> None:
        """Answer the next ``times`` requests whose path contains ``path_contains`` with ``status``."""
        with self._lock:
            self._failures.append(_Failure(status, times, path_contains, retry_after))

    def pause(self) -> None:
        """Hold every request unanswered from now on (the connection stays open), as a Hub that stopped answering."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def requests(self, method: str | None = None, path_contains: str = "") -> list[tuple[str, str, int]]:
        """(method, path with query, status) of the requests answered so far, oldest first."""
        with self._lock:
            return [
                r
                for r in self._log
                if (method is None or r[0] == method) and path_contains in urllib.parse.unquote(r[1])
            ]

    def bytes_served(self, path_contains: str = "") -> int:
        """Bytes of file contents in the answers to GETs so far whose path contains ``path_contains``."""
        with self._lock:
            return sum(n for path, n in self._served if path_contains in urllib.parse.unquote(path))

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()
            self._served.clear()

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.resume()
        self._http.shutdown()
        self._http.server_close()
        self._store.cleanup()

    # -- request handling ---------------------------------------------------------------------------

    def _take_failure(self, path: str) -> _Failure | None:
        with self._lock:
            for failure in self._failures:
                if failure.path_contains in urllib.parse.unquote(path):
                    failure.times -= 1
                    if failure.times <= 0:
                        self._failures.remove(failure)
                    return failure
        return None

    def _rate_limited(self) -> float | None:
        """Seconds until a request is allowed again when over ``max_requests_per_s`` (a 1 s window)."""
        if not self.max_requests_per_s:
            return None
        now = time.monotonic()
        with self._lock:
            self._window = [t for t in self._window if now - t < 1.0]
            if len(self._window) >= self.max_requests_per_s:
                return max(0.0, 1.0 - (now - self._window[0]))
            self._window.append(now)
        return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self._log.append((method, path, status))


class _Answer(Exception):
    def __init__(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


def _error(status: int, code: str | None, message: str) -> _Answer:
    headers = {"X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return _Answer(status, {"error": message}, headers)


_API = re.compile(
    r"^/api/datasets/(?P<repo>[^/]+/[^/]+?)(?:/(?P<op>refs|revision|tree|paths-info)(?:/(?P<rest>.*))?)?$"
)
_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_BUCKET_API = re.compile(r"^/api/buckets/(?P<bucket>[^/]+/[^/]+?)(?P<tree_root>/tree(?P<tree>/.*)?)?$")
_PREUPLOAD = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)$")
_COMMIT = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)$")
_LFS_BATCH = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_LFS_OBJECT = re.compile(r"^/lfs-objects/(?P<oid>[0-9a-f]{64})$")
_BUCKET_RESOLVE = re.compile(r"^/buckets/(?P<bucket>[^/]+/[^/]+)/resolve/(?P<path>.+)$")


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # the log is ``server.requests()``
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def _serve(self, method: str) -> None:
            if not server._running.wait(HELD_MAX_S):
                return
            self.status = 499  # until an answer is sent: the client went away
            self.recorded = False
            try:
                if server.latency_s:
                    time.sleep(server.latency_s)
                self._route(method)
            except _Answer as a:
                self._send(a.status, a.body, a.headers, head=method == "HEAD")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                if not self.recorded:  # nothing was sent
                    server._record(method, self.path, self.status)

        def _route(self, method: str) -> None:
            if (wait := server._rate_limited()) is not None:
                raise _Answer(429, {"error": "rate limited"}, {"Retry-After": str(max(1, round(wait)))})
            if (failure := server._take_failure(self.path)) is not None:
                headers = {} if failure.retry_after is None else {"Retry-After": str(failure.retry_after)}
                raise _Answer(failure.status, {"error": f"injected {failure.status}"}, headers)
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if self._write(method, url.path):
                return
            if m := _BUCKET_RESOLVE.match(url.path):
                bucket = self._bucket(m["bucket"])
                f = bucket.files.get(urllib.parse.unquote(m["path"]))
                if f is None:
                    raise _error(404, "EntryNotFound", f"{urllib.parse.unquote(m['path'])} does not exist")
                self._file_bytes(method, f, {"X-Xet-Hash": f.oid})
            elif m := _BUCKET_API.match(url.path):
                bucket = self._bucket(m["bucket"])
                if m["tree"] is None and m["tree_root"] is None:
                    size = sum(f.size for f in bucket.files.values())
                    self._send(
                        200,
                        {
                            "id": bucket.bucket_id,
                            "private": bucket.private,
                            "createdAt": "2026-01-01T00:00:00.000Z",
                            "size": size,
                            "totalFiles": len(bucket.files),
                        },
                    )
                else:
                    prefix = urllib.parse.unquote((m["tree"] or "").lstrip("/"))
                    self._bucket_tree(bucket, prefix, query)
            elif m := _RESOLVE.match(url.path):
                repo, commit = self._open(m["repo"], urllib.parse.unquote(m["rev"]))
                self._file(method, repo, commit, urllib.parse.unquote(m["path"]))
            elif m := _API.match(url.path):
                rest = m["rest"] or ""
                if m["op"] == "refs":
                    repo, _ = self._open(m["repo"], None)
                    self._send(200, self._refs(repo))
                elif m["op"] in ("revision", None):
                    repo, commit = self._open(m["repo"], urllib.parse.unquote(rest) if m["op"] else "main")
                    self._send(200, self._info(repo, commit))
                elif m["op"] == "tree":
                    rev, _, path = rest.partition("/")
                    repo, commit = self._open(m["repo"], urllib.parse.unquote(rev))
                    self._tree(repo, commit, urllib.parse.unquote(path).strip("/"), query)
                elif m["op"] == "paths-info" and method == "POST":
                    repo, commit = self._open(m["repo"], urllib.parse.unquote(rest))
                    length = int(self.headers.get("Content-Length") or 0)
                    form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                    paths = [p.strip("/") for p in form.get("paths", [])]
                    self._send(200, [self._entry(commit, p) for p in paths if p in commit.files or p in commit.dirs])
                else:
                    raise _error(404, None, "Not Found")
            else:
                raise _error(404, None, "Not Found")

        def _token(self) -> str | None:
            """The request's token, if any; one the server does not know is refused first, as the Hub does."""
            auth = self.headers.get("Authorization", "")
            token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
            if token is not None and token not in server.tokens:
                raise _error(401, None, INVALID_TOKEN)
            return token

        def _open(self, repo_id: str, revision: str | None) -> tuple[_Repo, _Commit]:
            """The repo and commit asked for, as the Hub checks them: the token first."""
            token = self._token()
            repo = server._repos.get(urllib.parse.unquote(repo_id))
            if repo is None or (repo.private and token is None):
                raise _error(401 if token is None else 404, "RepoNotFound", "Repository not found")
            commit = repo.commit(revision or "main")
            if commit is None:
                raise _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return repo, commit

        # -- writes ------------------------------------------------------------------------------

        def _write(self, method: str, path: str) -> bool:
            """Answer a write (create_repo, preupload, LFS batch and PUT, commit); False for a read."""
            if method == "PUT" and (m := _LFS_OBJECT.match(path)):
                self._put_object(m["oid"])
            elif method != "POST":
                return False
            elif path == "/api/repos/create":
                self._writer()
                body = json.loads(self._body())
                repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
                if body.get("type") != "dataset":
                    raise _error(400, None, "this test server holds dataset repos only")
                with server._lock:
                    if repo_id in server._repos:  # the Hub's 409 carries the url, which the client reads
                        message = "You already created this dataset repo"
                        url = f"{server.url}/datasets/{repo_id}"
                        raise _Answer(409, {"error": message, "url": url}, {"X-Error-Message": message})
                    repo = server._repos[repo_id] = _Repo(repo_id, body.get("visibility") == "private")
                    empty = _commit_of({})
                    repo.commits[empty.sha] = empty
                    repo.branches["main"] = empty.sha
                self._send(200, {"url": f"{server.url}/datasets/{repo_id}", "name": repo_id})
            elif m := _PREUPLOAD.match(path):
                self._writer()
                _, commit = self._open(m["repo"], urllib.parse.unquote(m["rev"]))
                files = json.loads(self._body())["files"]
                self._send(200, {"files": [self._upload_mode(commit, f["path"]) for f in files]})
            elif m := _LFS_BATCH.match(path):
                self._writer()
                self._open(m["repo"], None)
                objects = json.loads(self._body())["objects"]
                answer = []
                for o in objects:
                    entry: dict[str, Any] = {"oid": o["oid"], "size": o["size"], "authenticated": True}
                    if o["oid"] not in server._objects:
                        entry["actions"] = {"upload": {"href": f"{server.url}/lfs-objects/{o['oid']}"}}
                    answer.append(entry)
                self._send(200, {"transfer": "basic", "objects": answer})
            elif m := _COMMIT.match(path):
                self._writer()
                self._commit(m["repo"], urllib.parse.unquote(m["rev"]))
            else:
                return False
            return True

        def _writer(self) -> None:
            """A write needs a token the server knows (401 as the Hub answers one without)."""
            if self._token() is None:
                raise _error(401, None, INVALID_TOKEN)

        def _body(self) -> bytes:
            """The request's body, sent with a Content-Length or chunked (a streamed PUT)."""
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = []
            while (size := int(self.rfile.readline().split(b";")[0].strip(), 16)) > 0:
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)

        def _upload_mode(self, commit: _Commit, rel: str) -> dict[str, Any]:
            lfs = rel.endswith(UPLOAD_LFS_SUFFIXES)
            there = commit.files.get(rel)
            oid = None if there is None else (there.sha256 if lfs else there.oid)
            return {"path": rel, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}

        def _put_object(self, oid: str) -> None:
            data = self._body()
            if hashlib.sha256(data).hexdigest() != oid:
                raise _error(400, None, f"the bytes sent do not hash to {oid}")
            path = Path(server._store.name) / oid
            path.write_bytes(data)
            with server._lock:
                server._objects[oid] = _File(path, len(data), _blob_oid(data), oid)
            self._send(200, b"")

        def _commit(self, repo_id: str, revision: str) -> None:
            repo, parent = self._open(repo_id, revision)
            if revision not in repo.branches:
                raise _error(400, None, f"{revision} is not a branch: commits go to a branch")
            files = dict(parent.files)
            for line in self._body().splitlines():
                item = json.loads(line)
                key, value = item["key"], item["value"]
                if key == "header":
                    wanted = value.get("parentCommit")
                    if wanted and wanted != parent.sha:
                        raise _error(412, None, f"parent commit {wanted} is not the head {parent.sha}")
                elif key == "file":
                    data = base64.b64decode(value["content"])
                    path = Path(server._store.name) / f"blob-{_blob_oid(data)}"
                    path.write_bytes(data)
                    files[value["path"]] = _File(path, len(data), _blob_oid(data), None)
                elif key == "lfsFile":
                    f = server._objects.get(value["oid"])
                    if f is None or f.size != value["size"]:
                        raise _error(422, None, f"{value['path']}: LFS object {value['oid']} was never uploaded")
                    files[value["path"]] = f
                elif key in ("deletedFile", "deletedFolder"):
                    prefix = value["path"].rstrip("/") + "/"
                    files = {p: f for p, f in files.items() if p != value["path"] and not p.startswith(prefix)}
                else:
                    raise _error(400, None, f"unknown commit operation {key}")
            commit = _commit_of(files)
            with server._lock:
                repo.commits[commit.sha] = commit
                repo.branches[revision] = commit.sha
            url = f"{server.url}/datasets/{repo.repo_id}/commit/{commit.sha}"
            self._send(200, {"commitUrl": url, "commitOid": commit.sha, "success": True})

        def _bucket(self, bucket_id: str) -> _Bucket:
            """The bucket asked for, the token checked first (as ``_open``)."""
            token = self._token()
            bucket = server._buckets.get(urllib.parse.unquote(bucket_id))
            if bucket is None or (bucket.private and token is None):
                raise _error(401 if token is None else 404, "RepoNotFound", "Bucket not found")
            return bucket

        def _bucket_tree(self, bucket: _Bucket, prefix: str, query: dict[str, list[str]]) -> None:
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            entries: dict[str, dict[str, Any]] = {}
            for path, f in sorted(bucket.files.items()):
                if not path.startswith(prefix):
                    continue
                folder = prefix.rstrip("/")
                rest = path[len(folder) + 1 :] if folder else path
                if not recursive and "/" in rest:
                    sub = f"{folder}/{rest.split('/')[0]}" if folder else rest.split("/")[0]
                    entries[sub] = {"type": "directory", "path": sub, "uploadedAt": "2026-01-01T00:00:00.000Z"}
                    continue
                entries[path] = {
                    "type": "file",
                    "path": path,
                    "size": f.size,
                    "xetHash": f.oid,
                    "mtime": "2026-01-01T00:00:00.000Z",
                    "uploadedAt": "2026-01-01T00:00:00.000Z",
                }
            self._send_page([entries[n] for n in sorted(entries)], query)

        def _send_page(self, entries: list[dict[str, Any]], query: dict[str, list[str]]) -> None:
            """A listing's page (``page_size`` entries from ``cursor``), with the next page's URL in a
            ``Link`` header as the Hub paginates repo and bucket trees."""
            start = int(query.get("cursor", ["0"])[0])
            headers = {}
            if start + server.page_size < len(entries):
                params = {k: v[0] for k, v in query.items()} | {"cursor": str(start + server.page_size)}
                host = self.headers.get("Host") or server.url.split("//", 1)[1]  # a proxy in front keeps its own
                next_url = f"http://{host}{urllib.parse.urlsplit(self.path).path}?{urllib.parse.urlencode(params)}"
                headers["Link"] = f'<{next_url}>; rel="next"'
            self._send(200, entries[start : start + server.page_size], headers)

        def _refs(self, repo: _Repo) -> dict[str, Any]:
            def refs(names: dict[str, str], kind: str) -> list[dict[str, str]]:
                return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in sorted(names.items())]

            return {"branches": refs(repo.branches, "heads"), "tags": refs(repo.tags, "tags"), "converts": []}

        def _info(self, repo: _Repo, commit: _Commit) -> dict[str, Any]:
            return {
                "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit.sha,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": p} for p in sorted(commit.files)],
                "cardData": {},
            }

        def _entry(self, commit: _Commit, rel: str) -> dict[str, Any]:
            if rel in commit.files:
                return commit.files[rel].entry(rel)
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0, "path": rel}

        def _tree(self, repo: _Repo, commit: _Commit, path: str, query: dict[str, list[str]]) -> None:
            if path and path not in commit.dirs:
                code = "EntryNotFound"
                raise _error(404, code, f"{path} does not exist on {commit.sha}")
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            prefix = f"{path}/" if path else ""
            names = sorted(
                p
                for p in (*commit.dirs, *commit.files)
                if p and p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
            )
            self._send_page([self._entry(commit, p) for p in names], query)

        def _file(self, method: str, repo: _Repo, commit: _Commit, rel: str) -> None:
            f = commit.files.get(rel)
            if f is None:
                raise _error(404, "EntryNotFound", f"{rel} does not exist on {commit.sha}")
            headers = {"X-Repo-Commit": commit.sha}
            if f.sha256:
                headers |= {"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)}
            self._file_bytes(method, f, headers)

        def _file_bytes(self, method: str, f: _File, extra: dict[str, str]) -> None:
            """A file's bytes, or the range asked for (206; 416 when unsatisfiable)."""
            headers = {
                "ETag": f'"{f.etag}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
                **extra,
            }
            start, end, status = 0, f.size, 200
            if (ranged := self.headers.get("Range")) is not None:
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", ranged.strip())
                if not m or (not m[1] and not m[2]):
                    raise _Answer(416, b"", {"Content-Range": f"bytes */{f.size}"})
                if m[1]:
                    start, end = int(m[1]), min(f.size, int(m[2]) + 1 if m[2] else f.size)
                else:
                    start, end = max(0, f.size - int(m[2])), f.size
                if start >= f.size or start >= end:
                    raise _Answer(416, b"", {"Content-Range": f"bytes */{f.size}"})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
            with open(f.path, "rb") as fh:
                fh.seek(start)
                body = fh.read(end - start) if method == "GET" else b""
            with server._lock:
                server._served.append((self.path, len(body)))
            self._send(status, body, headers, head=method == "HEAD", length=end - start)

        def _send(
            self,
            status: int,
            body: Any,
            headers: dict[str, str] | None = None,
            *,
            head: bool = False,
            length: int | None = None,
        ) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
            self.status = status
            # Logged before the answer goes out: a client that has read the answer finds it logged.
            server._record(self.command, self.path, status)
            self.recorded = True
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if not isinstance(body, bytes):
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) if length is None else length))
            self.end_headers()
            if head:
                return
            if server.bytes_per_s:
                step = max(1, int(server.bytes_per_s / 50))
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    time.sleep(len(data[i : i + step]) / server.bytes_per_s)
            else:
                self.wfile.write(data)

    return Handler


@contextlib.contextmanager
def hub_server(**kwargs: Any) -> Iterator[HubServer]:
    server = HubServer(**kwargs).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """A fresh server per test, ``HF_ENDPOINT`` pointing at it (subprocesses inherit it), no token
    from the developer's environment or stored login: ``HF_HOME`` is an empty folder, where this
    process's ``huggingface_hub`` (which read ``HF_HOME`` at import) looks for the login too."""
    import huggingface_hub.constants

    with hub_server(tokens=(VALID_TOKEN,)) as server:
        home = tmp_path_factory.mktemp("hf_home")
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HOME", str(home))
        monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(home / "token"))
        monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        yield server
    if (hub := sys.modules.get("lerobot_shards.integrations.hub")) is not None:  # a later server may get this port
        hub._listings.clear()
        hub._found.clear()
        hub._bucket_roots.clear()
        hub.HubFileSystem.clear_instance_cache()


if __name__ == "__main__":  # a server for benchmarks: python tests/hub_server.py REPO_ID=FOLDER ...
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", help="REPO_ID=FOLDER")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--mb-per-s", type=float, default=0.0)
    parser.add_argument("--requests-per-s", type=float, default=0.0)
    args = parser.parse_args()
    hub = HubServer().start()
    hub.latency_s, hub.bytes_per_s = args.latency_ms / 1000, args.mb_per_s * 1e6
    hub.max_requests_per_s = args.requests_per_s
    for spec in args.datasets:
        name, _, folder = spec.partition("=")
        hub.add_dataset(name, Path(folder))
    print(hub.url, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    os._exit(0)
