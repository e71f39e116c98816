"""A bucket that goes away mid-epoch: the loader fails with an error naming the shard (or the raw
dataset's file) and the episode, never hangs, and says nothing of the credentials or the endpoint."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import traceback
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.upload import upload_dataset
from lerobot_shards.loader import EpisodePoolDataset, ReadOptions
from lerobot_shards.loader.decoding.decoders import DecodeError, DecoderCache
from lerobot_shards.loader.read.remote import with_timeouts
from lerobot_shards.loader.read.sources import open_source
from lerobot_shards.storage import StorageLocation
from lerobot_shards.synth import read_identity
from s3_server import moto_server

SECRET = "fault-test-secret-4e1b77"
# Explicit short timeouts and few retries: a dead endpoint must fail in seconds, not minutes.
FAST_FAIL = {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2}}
BATCH_TIMEOUT_S = 120  # the DataLoader raises "timed out" instead of hanging: the bound this test enforces
CAM = "observation.images.front"


def _hides_endpoint(error: BaseException, endpoint_url: str) -> str:
    """The error's text; neither it, its cause nor its printed traceback shows the endpoint."""
    host, port = endpoint_url.split("//")[1].split(":")
    for text in (str(error), str(error.__cause__), "".join(traceback.format_exception(error))):
        assert host not in text and f":{port}" not in text and f", {port})" not in text, text
    return str(error)


def _failure_after_killing(server: subprocess.Popen, batches: Any) -> BaseException:
    """Kill the storage server, read on until the DataLoader raises, and return that error."""
    server.kill()
    server.wait()
    with pytest.raises(Exception) as failure:
        for _ in batches:
            pass
    batches._shutdown_workers()  # now: the traceback keeps the iterator alive until a GC pass
    return failure.value


def test_server_killed_mid_epoch_names_the_shard(synth_factory, tmp_path: Path) -> None:
    raw = synth_factory(num_episodes=10, cameras=("observation.images.front",), length_range=(6, 9), seed=5)
    convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    with moto_server(tmp_path) as (server, proc):
        options = {
            "key": "fault-test-key",
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": server.endpoint_url},
            "config_kwargs": FAST_FAIL,
        }
        server.filesystem().mkdir("faults")
        upload_dataset(tmp_path / "out", "s3://faults/ds", storage_options=options, progress=False)
        # one resident episode, one read ahead: each worker still has shards to read after the first batch
        ds = EpisodePoolDataset(
            "s3://faults/ds", storage_options=options, episode_pool_size=1, prefetch_episodes=1, seed=0
        )
        batches = iter(DataLoader(ds, batch_size=2, num_workers=2, timeout=BATCH_TIMEOUT_S))
        next(batches), next(batches)  # one batch from each worker: both have opened the dataset
        error = _failure_after_killing(proc, batches)
    text = _hides_endpoint(error, server.endpoint_url)
    assert "timed out" not in text, text
    assert re.search(r"faults/ds/shards/shard-0000\d\d\.(tar|idx\.json)", text), text  # the shard or its sidecar
    assert SECRET not in text
    assert "127.0.0.1" not in repr(ds.stats())


@pytest.mark.slow
def test_dead_endpoint_errors_name_the_file_and_episode_not_the_endpoint(synth_factory, tmp_path: Path) -> None:
    """Sources open on a bucket whose server then dies: a sidecar read, a shard read (ranged, or into
    the node cache), a raw dataset's episode read (mp4 into the node cache, parquet) and the decoding
    of an mp4 from the bucket each fail naming file and episode; a failed raw episode lets go of its mp4,
    and a raw episode read before holds its frames (cut out of its mp4 when read)."""
    raw = synth_factory(num_episodes=4, cameras=(CAM,), length_range=(6, 9), episodes_per_data_file=1, seed=3)
    convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    with moto_server(tmp_path) as (server, proc):
        fs = server.filesystem()
        fs.mkdir("dead")
        fs.put(str(tmp_path / "out") + "/", "dead/conv", recursive=True)
        fs.put(str(raw) + "/", "dead/raw", recursive=True)
        options = with_timeouts("s3://dead", {**server.storage_options, "config_kwargs": FAST_FAIL})
        ranged = open_source("s3://dead/conv", ReadOptions(storage_options=options))
        cached = open_source("s3://dead/conv", ReadOptions(storage_options=options, cache_dir=str(tmp_path / "cache")))
        raw_cached = open_source(
            "s3://dead/raw", ReadOptions(storage_options=options, cache_dir=str(tmp_path / "raw-cache"))
        )
        raw_ranged = open_source("s3://dead/raw", ReadOptions(storage_options=options))
        sources = (ranged, cached, raw_cached, raw_ranged)
        ranged.sidecar(1), cached.sidecar(1)  # their shard 1 is read next, not its sidecar
        raw_cached.read_episode(0, 0).release()  # episode 0's files are read; episodes 2 and 3 share none
        clip = raw_ranged.read_episode(0, 0).clips[CAM]  # without a cache, decoded from the bucket
        proc.kill()
        proc.wait()
        try:
            shard = r"s3://dead/conv/shards/shard-00000{0}\.tar: episode {0}: cannot read it \({1}.*; check that"
            for source, episode, how in (
                (ranged, 1, "OSError: .*reading bytes"),
                (cached, 1, "OSError: .*reading bytes"),
                (ranged, 2, ""),
            ):
                with pytest.raises(OSError) as failure:
                    source.read_episode(episode, episode)
                text = _hides_endpoint(failure.value, server.endpoint_url)
                assert re.match(shard.format(episode, how), text), text
            with pytest.raises(OSError) as failure:
                raw_cached.read_episode(0, 2)
            text = _hides_endpoint(failure.value, server.endpoint_url)
            mp4 = f"s3://dead/raw/videos/{CAM}/chunk-000/file-001.mp4"
            assert text.startswith(f"{mp4}: episode 2: cannot read it ("), text
            assert "EndpointConnectionError" in text and "check that the storage server is up" in text, text
            assert not raw_cached._files and not raw_cached._refs, "the failed episode still holds its mp4"
            with pytest.raises(OSError) as failure:  # its mp4's header was read with episode 0's: the parquet fails
                raw_ranged.read_episode(0, 1)
            text = _hides_endpoint(failure.value, server.endpoint_url)
            assert text.startswith("s3://dead/raw/data/chunk-000/file-001.parquet: episode 1: cannot read it ("), text
            with pytest.raises(OSError) as failure:  # its own mp4's header is read first, and named
                raw_ranged.read_episode(0, 3)
            text = _hides_endpoint(failure.value, server.endpoint_url)
            assert text.startswith(f"{mp4}: episode 3 camera {CAM}: cannot read it ("), text
            decoders = DecoderCache(1, location=StorageLocation("s3://dead/raw", options))
            assert clip.data is not None  # its frames were cut out of the mp4 with the episode: no request
            assert read_identity(decoders.frames(clip, [0])[0]) == (0, 0)
            url = mp4.replace("file-001", "file-000")  # episode 0's file, as a clip not cut (B-frames) names it
            uncut = dataclasses.replace(clip, cache_key=url, data=None, url=url, first_frame=0, frame_mappings=None)
            with pytest.raises(DecodeError) as failure:  # decoded from the bucket
                decoders.frames(uncut, [0])
            text = _hides_endpoint(failure.value, server.endpoint_url)
            assert text.startswith(f"s3://dead/raw/data/chunk-000/file-000.parquet: episode 0 camera {CAM} "), text
        finally:
            for source in sources:
                source.close()


@pytest.mark.slow
def test_raw_bucket_dies_mid_epoch_in_a_spawned_worker(synth_factory, tmp_path: Path) -> None:
    """A spawned DataLoader worker starts with nothing registered: it still hides the endpoint."""
    raw = synth_factory(num_episodes=6, cameras=(CAM,), length_range=(6, 9), episodes_per_data_file=1, seed=4)
    with moto_server(tmp_path) as (server, proc):
        server.filesystem().mkdir("rawfaults")
        server.filesystem().put(str(raw) + "/", "rawfaults/ds", recursive=True)
        options = {**server.storage_options, "config_kwargs": FAST_FAIL}
        ds = EpisodePoolDataset(
            "s3://rawfaults/ds",
            storage_options=options,
            episode_pool_size=1,
            prefetch_episodes=1,
            episodes_per_shard=1,
            cache_dir=str(tmp_path / "cache"),
        )
        loader = DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn", timeout=BATCH_TIMEOUT_S)
        batches = iter(loader)
        next(batches)
        error = _failure_after_killing(proc, batches)
    text = _hides_endpoint(error, server.endpoint_url)
    assert re.search(
        rf"rawfaults/ds/(data/chunk-000/file-\d+\.parquet|videos/{CAM}/chunk-000/file-\d+\.mp4): episode \d", text
    ), text
    assert "127.0.0.1" not in repr(ds.stats())
