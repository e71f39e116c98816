"""``filesystems.url_to_fs``: S3 file systems whose clients start warm in forked DataLoader workers.

A real S3-protocol server and real (forked) DataLoader workers: the worker's file system has a
session of its own that shares the parent's parsed botocore data, and reads the right bytes.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader, IterableDataset

from lerobot_shards import filesystems
from lerobot_shards.filesystems import url_to_fs


class _ReadInWorker(IterableDataset):
    """Opens the object in the worker, as a source does, and reports what its file system holds."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url, self.options = url, options

    def __iter__(self) -> Iterator[dict[str, Any]]:
        fs, path = url_to_fs(self.url, **self.options)
        data = fs.cat_file(path)
        yield {"data": data, "session": id(fs.session), "loader": id(fs.session.get_component("data_loader"))}


@pytest.fixture(scope="module")
def object_url(s3_server) -> str:
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server.storage_options, skip_instance_cache=True)  # not the instance tests get
    fs.mkdir("fs-warm")
    fs.pipe("fs-warm/object.bin", b"identity 0123456789")
    return "s3://fs-warm/object.bin"


def test_a_forked_worker_builds_its_client_from_the_parents_parsed_models(object_url, s3_server) -> None:
    # options no other test uses: fsspec's instance cache must not hand back another test's instance
    opts = {**s3_server.storage_options, "max_concurrency": 7}
    fs, path = url_to_fs(object_url, **opts)
    assert fs.cat_file(path) == b"identity 0123456789"  # the parent's client: its loader parsed the models
    assert url_to_fs(object_url, **opts)[0] is fs  # fsspec still reuses the instance
    parent_session, parent_loader = fs.session, fs.session.get_component("data_loader")
    assert parent_loader is filesystems._loader
    worker = DataLoader(
        _ReadInWorker(object_url, opts),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="fork",  # a spawned worker inherits nothing: it starts cold
    )
    (got,) = worker
    assert got["data"] == b"identity 0123456789"
    assert got["session"] != id(parent_session)  # credentials, events and clients: the worker's own
    assert got["loader"] == id(parent_loader)  # the parsed botocore data: inherited, not parsed again
    type(fs).clear_instance_cache()  # as in a spawned worker: the options travel, not the session
    clone = pickle.loads(pickle.dumps(fs))
    assert clone is not fs and clone.session is None
    assert clone.cat_file(path) == b"identity 0123456789"


def test_options_meant_for_s3fs_own_session_are_left_to_it(object_url, s3_server, tmp_path) -> None:
    import aiobotocore.session

    opts = s3_server.storage_options
    fs, _ = url_to_fs(object_url, **opts, profile="someone", skip_instance_cache=True)
    assert fs.session is None  # s3fs makes its session with profile=... itself
    given = aiobotocore.session.AioSession()
    fs, path = url_to_fs(object_url, **opts, session=given, skip_instance_cache=True)
    assert fs.session is given and fs.cat_file(path) == b"identity 0123456789"
    local, _ = url_to_fs(str(tmp_path))
    assert "file" in local.protocol
