"""A bucket that goes away mid-epoch: the loader fails with an error naming the shard, never hangs,
and says nothing of the credentials."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.upload import upload_dataset
from lerobot_shards.loader import EpisodePoolDataset
from s3_server import moto_server

SECRET = "fault-test-secret-4e1b77"
# Explicit short timeouts and few retries: a dead endpoint must fail in seconds, not minutes.
FAST_FAIL = {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2}}
BATCH_TIMEOUT_S = 120  # the DataLoader raises "timed out" instead of hanging: the bound this test enforces


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
        proc.kill()
        proc.wait()
        with pytest.raises(Exception) as failure:
            for _ in batches:
                pass
    text = str(failure.value)
    assert "timed out" not in text, text
    assert re.search(r"faults/ds/shards/shard-0000\d\d\.(tar|idx\.json)", text), text  # the shard or its sidecar
    assert SECRET not in text
