"""Requests per rank do not grow with its DataLoader workers: counted at the real S3-protocol server.

A rank opens the manifest once (its workers inherit the parsed manifest) and its consumers read
each sidecar of the shards they hold; more workers split the rank's shards further, never
reading the manifest, or a whole shard's sidecar, again.
"""

from __future__ import annotations

import re
from collections import Counter

import fsspec
import pytest
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

CAM = "observation.images.front"


@pytest.fixture(scope="module")
def bucket_url(tmp_path_factory, s3_server) -> str:
    """8 short episodes in 8 one-episode shards, in a bucket of their own."""
    base = tmp_path_factory.mktemp("startup")
    raw = synth_dataset(
        base / "raw", num_episodes=8, cameras=(CAM,), length_range=(4, 6), episodes_per_video_file=4, seed=9
    )
    convert_dataset(raw, base / "converted", ConvertOptions(episodes_per_shard=1), progress=False)
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    fs.makedirs("startup", exist_ok=True)
    fs.put(str(base / "converted") + "/", "s3://startup/ds", recursive=True)
    return "s3://startup/ds"


def _metadata_gets(log: str) -> Counter:
    """GETs of the manifest and sidecars in a server log, by object."""
    return Counter(re.findall(r"GET /startup/ds/((?:manifest\.json|shards/[^ ?\"]+\.idx\.json))", log))


def _rank_gets(s3_server, url: str, rank: int, world_size: int, workers: int) -> Counter:
    """A rank's metadata GETs over a whole epoch with ``workers`` DataLoader workers."""
    start = len(s3_server.log.read_text(errors="replace"))
    ds = EpisodePoolDataset(
        url,
        storage_options=s3_server.storage_options,
        cameras=[CAM],
        rank=rank,
        world_size=world_size,
        equal_samples_per_rank=False,
        seed=1,
    )
    assert sum(len(b["index"]) for b in DataLoader(ds, batch_size=4, num_workers=workers))
    return _metadata_gets(s3_server.log.read_text(errors="replace")[start:])


@pytest.mark.parametrize("world_size", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_metadata_requests_per_rank_are_the_same_with_0_1_2_workers(s3_server, bucket_url, world_size) -> None:
    """One manifest GET per rank whatever its workers, no metadata object read twice, and over all
    ranks every sidecar once (a rank's own shards, hence its sidecars, follow the layout: on one
    rank the same for every worker count)."""
    per_workers = {}
    for workers in (0, 1, 2):
        ranks = [_rank_gets(s3_server, bucket_url, rank, world_size, workers) for rank in range(world_size)]
        for gets in ranks:
            assert gets["manifest.json"] == 1, (workers, gets)  # the workers inherit the parsed manifest
            assert set(gets.values()) == {1}, (workers, gets)  # nothing read twice
        per_workers[workers] = sum(ranks, Counter())
        assert len(per_workers[workers]) == 1 + 8  # the manifest per rank, every sidecar once
    if world_size == 1:
        assert per_workers[0] == per_workers[1] == per_workers[2]
