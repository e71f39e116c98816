"""File systems for URLs (fsspec), whose S3 clients start warm in forked DataLoader workers.

Building an S3 client (s3fs over aiobotocore) parses botocore's JSON service models and lists its
data directory: 0.15-0.25 s on a quiet 2-core machine, 0.3-0.4 s under load, paid by every
DataLoader worker before its first request, so by the first batch. botocore keeps what it parsed in
its session's *data loader*, a cache of parsed files and nothing else. Every S3 file system opened
here gets a session of its own, as s3fs would make it (credentials, events and clients are not
shared), whose data loader is shared by the whole process tree: a forked worker inherits the
parent's, already filled while the dataset read its manifest, and its first client is built in
about 0.01 s. A spawned (or forkserver) worker starts cold, as before.

Options that s3fs would hand to the session it builds itself (``profile``, say) are left to s3fs:
no session is given then, and nothing changes.

Hugging Face Hub sources: ``hf://`` URLs get ``integrations.hub.HubFileSystem`` (HfFileSystem with
bounded, retried requests) and a dataset repo id given where a source path goes is resolved to one
(``resolve_source``); the Hub module is imported only then.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import fsspec

S3_PROTOCOLS = ("s3", "s3a")
HUB_PROTOCOL = "hf"
# A Hub repo id as the Hub allows it: namespace/name, letters, digits, '-', '_', '.', no '--' or '..'.
_REPO_ID = re.compile(r"^(?!.*(?:--|\.\.))[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

_lock = threading.Lock()
_loader: Any = None  # botocore's data loader, filled once per process tree (inherited on fork)


def _after_fork() -> None:
    """A child forked while another thread held the lock would wait on it forever: a new one."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def url_to_fs(url: str, **storage_options: Any) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs``; an S3 file system that would make a cold session of its own gets
    a warm one instead (set on the instance, not in its options: pickling it for a spawned worker
    carries the options only)."""
    if fsspec.core.split_protocol(str(url))[0] == HUB_PROTOCOL:
        from .integrations.hub import filesystem_for

        return filesystem_for(str(url), storage_options)
    fs, path = fsspec.core.url_to_fs(str(url), **storage_options)
    if _makes_own_session(fs):
        fs.session = warm_session()
    return fs, path


def protocols(fs: Any) -> tuple[str, ...]:
    """The names an fsspec file system answers to (``file`` and ``local`` for local disk; s3fs:
    ``s3``, ``s3a``)."""
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _makes_own_session(fs: Any) -> bool:
    """An s3fs file system with no session yet and no options meant for the session s3fs would make
    (s3fs keeps those in ``fs.kwargs``)."""
    if not set(S3_PROTOCOLS) & set(fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return False
    return getattr(fs, "session", "") is None and getattr(fs, "kwargs", None) == {}


def warm_session() -> Any:
    """A new aiobotocore session, as s3fs would make (its own credentials, events and clients), whose
    data loader is the process tree's: the first one made here, filled by the first client built."""
    global _loader
    import aiobotocore.session  # type: ignore[import-untyped]

    session = aiobotocore.session.AioSession()
    with _lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


def hub_repo_id(source: str, base: str | os.PathLike[str] = "") -> str | None:
    """``source`` when it names a Hub dataset repo (``lerobot/pusht``), else None; local paths are
    looked for under ``base`` (a mixture file's folder), else the working directory.

    The rule: a URL (``scheme://``) is a URL; a path that exists locally is that path, even one
    shaped like a repo id, and so is one whose first part is a local folder (``out/demo`` beside an
    ``out/`` folder: a mistyped path is said missing, not looked up on the Hub); otherwise
    ``namespace/name`` with the Hub's characters (one slash, no leading ``.``, ``/`` or ``~``) is a
    repo id, and anything else a local path.
    """
    text = str(source)
    local = os.path.join(base, text)
    if "://" in text or not _REPO_ID.match(text) or os.path.lexists(local) or os.path.isdir(os.path.dirname(local)):
        return None
    return text


def resolve_source(source: str, revision: str | None = None, storage_options: Mapping[str, Any] | None = None) -> str:
    """A source as given, or for a Hub repo id ``hf://datasets/<repo_id>@<commit>``: the revision
    resolved as LeRobot does (None: the codebase-version tag) and pinned to its commit.

    Called once where a user names a source (commands, datasets); what it returns is what workers,
    records and resume states keep, so a moved tag never changes what a job reads.
    """
    repo_id = hub_repo_id(source)
    if repo_id is None:
        if revision is not None:
            raise ValueError(f"{source}: revision={revision!r} applies to a Hub repo id (namespace/name) only")
        return str(source)
    from .integrations.hub import HubNotFound, repo_url

    try:
        return repo_url(repo_id, revision, storage_options)
    except HubNotFound as e:
        raise HubNotFound(f"{e} (and no local folder {source!r} exists)") from None
