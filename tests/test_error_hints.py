"""Every error names the file, episode or field and gives the right hint: a local problem of the
node cache is not reported as an unreachable storage server; frame rates that are no frame rate
(0, inf, NaN) are refused naming the field."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import fsspec
import pytest

from convert_helpers import run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.read import shard_cache as cache_module
from lerobot_shards.safe_io import UnsafePathError

STORAGE_HINT = "check that the storage server is up"


@pytest.fixture(scope="module")
def bucket_url(s3_server, synth_factory, tmp_path_factory) -> str:
    raw = synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))
    out = tmp_path_factory.mktemp("hints") / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1), progress=False)
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    fs.makedirs("hints", exist_ok=True)
    fs.put(str(out) + "/", "s3://hints/ds", recursive=True)
    return "s3://hints/ds"


def _first_sample(url: str, s3_server, cache: Path) -> None:
    ds = EpisodePoolDataset(url, storage_options=s3_server.storage_options, cache_dir=str(cache), shuffle=False)
    next(iter(ds))


def test_a_directory_where_a_cached_file_should_be(bucket_url: str, s3_server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    prefix = hashlib.sha1(bucket_url.encode()).hexdigest()[:16]  # RemoteIO's folder for the dataset
    (cache / prefix / "shard-000000.tar").mkdir(parents=True)
    with pytest.raises(OSError) as info:
        _first_sample(bucket_url, s3_server, cache)
    text = str(info.value)
    assert "shard-000000.tar: episode 0" in text and "a directory stands where the cache keeps a file" in text
    assert STORAGE_HINT not in text


def test_a_full_cache_disk(bucket_url: str, s3_server, tmp_path: Path, monkeypatch) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module.os, "pwrite", full)  # the cache's writes of downloaded chunks
    with pytest.raises(OSError) as info:
        _first_sample(bucket_url, s3_server, tmp_path / "cache")
    text = str(info.value)
    assert "shard-000000.tar: episode 0" in text and "the disk of cache_dir is full" in text, text
    assert STORAGE_HINT not in text


@pytest.mark.parametrize("fps", [0, -1, float("inf"), float("nan"), "30", True])
def test_a_source_frame_rate_that_is_none(fps, synth_factory, tmp_path: Path) -> None:
    raw = shutil.copytree(synth_factory(num_episodes=2, length_range=(6, 8)), tmp_path / "raw")
    info = json.loads((raw / "meta/info.json").read_text())
    info["fps"] = fps
    (raw / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"meta/info\.json: fps = .* is not a frame rate"):
        LeRobotV3Source(str(raw))
    result = run_cli("convert", raw, tmp_path / "out", "--no-progress")
    assert result.returncode == 1 and "meta/info.json: fps =" in result.stderr, result.stderr


def test_synth_refuses_fps_0(tmp_path: Path) -> None:
    result = run_cli("synth", tmp_path / "ds", "--fps", "0")
    assert result.returncode == 2 and "--fps" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_only_transport_errors_get_the_storage_hint() -> None:
    """``reading`` blames the storage server for what a transport library raised, never for our own
    errors, a bug or memory running out (each passes unchanged)."""
    from botocore.exceptions import ReadTimeoutError

    from lerobot_shards.loader.read.remote import reading

    for own in (MemoryError(), TypeError("'<=' not supported"), AttributeError("x"), SourceError("bad field")):
        with pytest.raises(type(own)) as raised, reading("s3://b/ds/shards/shard-000000.tar: episode 0"):
            raise own
        assert raised.value is own and STORAGE_HINT not in str(raised.value)
    with pytest.raises(
        OSError, match=rf"shard-000000\.tar: episode 0: cannot read it \(ReadTimeoutError.*{STORAGE_HINT}"
    ):
        with reading("s3://b/ds/shards/shard-000000.tar: episode 0"):
            raise ReadTimeoutError(endpoint_url="http://host:9000")


def _prefix(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()[:16]  # RemoteIO's folder for the dataset


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda c, u: c.write_text("mine"), ValueError, r"cache_dir '.*cache' is not a directory"),
        (
            lambda c, u: (c.mkdir(), (c / ".locks").write_text("mine")),
            OSError,
            r"\.locks\); a file stands where the cache keeps a folder",
        ),
        (
            lambda c, u: (c.mkdir(), (c / _prefix(u)).write_text("mine")),
            OSError,
            r"shard-000000\.tar: episode 0: Not a directory .*a file stands where the cache keeps a folder",
        ),
        (
            lambda c, u: ((c / _prefix(u)).mkdir(parents=True), os.mkfifo(c / _prefix(u) / "shard-000000.tar")),
            UnsafePathError,
            r"shard-000000\.tar: cache entry .* is not a regular file; the cache does not read or delete it",
        ),
    ],
    ids=["cache_dir a file", ".locks a file", "dataset folder a file", "cached shard a FIFO"],
)
def test_a_cache_dir_holding_something_else(make, error, message, bucket_url: str, s3_server, tmp_path: Path) -> None:
    """Whatever a user (or another program) left where the cache keeps its files: one error naming
    it and the fix, never the storage hint, never a hang on a FIFO; the user's file stays."""
    cache = tmp_path / "cache"
    make(cache, bucket_url)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(error, match=message) as raised:
        _first_sample(bucket_url, s3_server, cache)
    assert STORAGE_HINT not in str(raised.value)
    assert set(before) <= {p.name for p in tmp_path.rglob("*")}  # nothing of the user's removed
