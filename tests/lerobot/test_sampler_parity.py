"""The frames an epoch samples are exactly those LeRobot 0.6.1's ``EpisodeAwareSampler`` samples for a
policy's ``drop_n_last_frames`` (Diffusion's, from LeRobot's own config), each once, over ranks and
DataLoader workers, from converted shards and from the raw source, all episodes or a subset."""

from __future__ import annotations

import collections

import pytest
from torch.utils.data import DataLoader

from conftest import Dataset
from lerobot_shards.loader import EpisodePoolDataset


def _lerobots(ds: Dataset, drop: int, episodes: list[int] | None) -> collections.Counter:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.sampler import EpisodeAwareSampler

    lr = LeRobotDataset(ds.repo_id, root=ds.raw, episodes=episodes)
    sampler = EpisodeAwareSampler(
        lr.meta.episodes["dataset_from_index"],
        lr.meta.episodes["dataset_to_index"],
        episode_indices_to_use=lr.episodes,
        drop_n_last_frames=drop,
        shuffle=True,
        seed=7,
        absolute_to_relative_idx=lr.absolute_to_relative_idx,
    )
    return collections.Counter(int(lr.hf_dataset[i]["index"]) for i in sampler)


@pytest.mark.parametrize("source", ["shards", "raw"])
@pytest.mark.parametrize("episodes", [None, [0, 2]])
def test_an_epoch_samples_lerobots_frames_once(written: Dataset, source: str, episodes: list[int] | None) -> None:
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    drop = DiffusionConfig().drop_n_last_frames
    assert drop == 7
    want = _lerobots(written, drop, episodes)
    assert set(want.values()) == {1}
    url = str(written.shards if source == "shards" else written.raw)
    seen: collections.Counter = collections.Counter()
    for rank in range(2):
        ours = EpisodePoolDataset(
            url,
            episodes=episodes,
            cameras=[],
            drop_n_last_frames=drop,
            rank=rank,
            world_size=2,
            equal_samples_per_rank=False,
            seed=7,
        )
        for batch in DataLoader(ours, batch_size=4, num_workers=2):
            seen.update(batch["index"].tolist())
    assert seen == want
