"""The storage location (storage.py): built once, timeouts applied, secrets registered in
every process it reaches, its file system never inherited across a fork."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path
from typing import Any

from lerobot_shards.redaction import redact
from lerobot_shards.storage import StorageLocation
from lerobot_shards.timeouts import READ_TIMEOUT_S
from waits import HANG_GUARD_S

SECRET = "SECRETOFTHELOCATION"
ENDPOINT = "http://10.213.7.9:19999"


def _options() -> dict[str, Any]:
    return {"key": "AKIDLOCATION", "secret": SECRET, "client_kwargs": {"endpoint_url": ENDPOINT}}


def _redacted_in_child(blob: bytes, queue: Any) -> None:
    location = pickle.loads(blob)
    queue.put((redact(f"failed with {SECRET} at {ENDPOINT}/b/k"), location.options["config_kwargs"]["read_timeout"]))


def test_a_spawned_process_that_unpickles_it_hides_its_secrets_and_keeps_the_timeouts() -> None:
    given = _options()
    location = StorageLocation("s3://bucket/ds", given)
    assert given == _options(), "the caller's options were changed"
    assert location.options["config_kwargs"]["read_timeout"] == READ_TIMEOUT_S
    blob = pickle.dumps(location)
    assert b"_opened" not in blob  # only the URL and the options travel, never a file system
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_redacted_in_child, args=(blob, queue))
    child.start()
    text, timeout = queue.get(timeout=HANG_GUARD_S)
    child.join(timeout=HANG_GUARD_S)
    assert SECRET not in text and "10.213.7.9" not in text, text
    assert timeout == READ_TIMEOUT_S


def _fresh_fs_in_child(location: StorageLocation, parents: Any, queue: Any) -> None:
    queue.put((location.fs is parents, location.root))


def test_a_forked_process_makes_its_own_file_system(tmp_path: Path) -> None:
    location = StorageLocation(tmp_path / "ds/")
    parents = location.fs
    assert location.fs is parents  # made once per process
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_fresh_fs_in_child, args=(location, parents, queue))
    child.start()
    inherited, root = queue.get(timeout=HANG_GUARD_S)
    child.join(timeout=HANG_GUARD_S)
    assert not inherited
    assert root == location.root == str(tmp_path / "ds")
