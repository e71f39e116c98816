"""Every error names the file, episode or field and gives the right hint: a local problem of the
node cache is not reported as an unreachable storage server; frame rates that are no frame rate
(0, inf, NaN) are refused naming the field."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import fsspec
import pytest

from convert_helpers import run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader import cache as cache_module

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

    from lerobot_shards.loader.remote import reading

    for own in (MemoryError(), TypeError("'<=' not supported"), AttributeError("x"), SourceError("bad field")):
        with pytest.raises(type(own)) as raised, reading("s3://b/ds/shards/shard-000000.tar: episode 0"):
            raise own
        assert raised.value is own and STORAGE_HINT not in str(raised.value)
    with pytest.raises(
        OSError, match=rf"shard-000000\.tar: episode 0: cannot read it \(ReadTimeoutError.*{STORAGE_HINT}"
    ):
        with reading("s3://b/ds/shards/shard-000000.tar: episode 0"):
            raise ReadTimeoutError(endpoint_url="http://host:9000")
