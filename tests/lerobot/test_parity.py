"""Our samples equal LeRobot 0.6.1's own ``LeRobotDataset(..., return_uint8=True)[index]``, key by key,
and ``meta`` equals ``LeRobotDatasetMetadata``: on the real fixture and on a dataset LeRobot's writer
recorded, from converted shards and from the raw source, with policy-shaped windows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from conftest import Dataset
from lerobot_shards.loader import EpisodePoolDataset

SAMPLES = 300


def _windows(meta: Any) -> dict[str, list[float]]:
    """Two past frames per camera (and the current), a state pair, a 50-step action chunk (crosses episode ends)."""
    fps = meta.fps
    out = {cam: [-2 / fps, -1 / fps, 0.0] for cam in meta.camera_keys}
    out["observation.state"] = [-1 / fps, 0.0]
    out["action"] = [i / fps for i in range(50)]
    return out


@pytest.fixture(scope="module")
def reference() -> Callable[[Dataset], Any]:
    """LeRobot's dataset per dataset, its items by index cached (shards and raw compare to the same item)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    built: dict[str, tuple[Any, dict[int, dict]]] = {}

    def get(ds: Dataset) -> tuple[Any, dict[int, dict]]:
        if ds.repo_id not in built:
            meta_probe = EpisodePoolDataset(str(ds.raw)).meta
            lr = LeRobotDataset(ds.repo_id, root=ds.raw, delta_timestamps=_windows(meta_probe), return_uint8=True)
            built[ds.repo_id] = (lr, {})
        return built[ds.repo_id]

    return get


def _same(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert sorted(ours) == sorted(theirs), where
    for key, want in theirs.items():
        got = ours[key]
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), (where, key)
            assert got.dtype == want.dtype and got.shape == want.shape, (where, key, got.dtype, want.dtype, got.shape)
            assert torch.equal(got, want), (where, key)
        else:
            assert got == want, (where, key)


@pytest.mark.parametrize("which", ["real", "written"])
@pytest.mark.parametrize("source", ["shards", "raw"])
def test_samples_equal_lerobots(which: str, source: str, request: pytest.FixtureRequest, reference) -> None:
    ds: Dataset = request.getfixturevalue(which)
    lerobot, cache = reference(ds)
    url = str(ds.shards if source == "shards" else ds.raw)
    ours = EpisodePoolDataset(url, delta_timestamps=_windows(lerobot.meta), image_dtype=torch.uint8, seed=5)
    seen, edges, epoch = 0, 0, 0
    while seen < SAMPLES:
        ours.set_epoch(epoch)
        for sample in ours:
            index = int(sample["index"])
            if index not in cache:
                cache[index] = lerobot[index]
            _same(sample, cache[index], f"{which}/{source} index {index}")
            edges += bool(sample["action_is_pad"].any())
            seen += 1
            if seen == SAMPLES:
                break
        epoch += 1
    assert edges > 0  # some action chunks ran past their episode's end (padding compared too)


@pytest.mark.parametrize("which", ["real", "written"])
@pytest.mark.parametrize("source", ["shards", "raw"])
def test_samples_through_the_frame_cache_equal_lerobots(
    which: str, source: str, request: pytest.FixtureRequest, reference, tmp_path
) -> None:
    """The same through the decoded-frame cache: one episode, an epoch that fills it (samples read
    from fills under way) and one served from the complete entries, no frame decoded."""
    ds: Dataset = request.getfixturevalue(which)
    lerobot, cache = reference(ds)
    url = str(ds.shards if source == "shards" else ds.raw)
    ours = EpisodePoolDataset(
        url,
        delta_timestamps=_windows(lerobot.meta),
        image_dtype=torch.uint8,
        seed=5,
        episodes=[1],
        frame_cache_dir=str(tmp_path),
    )
    for epoch in range(2):
        ours.set_epoch(epoch)
        for sample in ours:
            index = int(sample["index"])
            if index not in cache:
                cache[index] = lerobot[index]
            _same(sample, cache[index], f"{which}/{source} epoch {epoch} index {index} (frame cache)")
        total = ours.stats()["total"]
        assert total["frame_cache_hits"] > 0
    assert total["frames_decoded"] == 0 and total["frames_filled"] == 0


@pytest.mark.parametrize("which", ["real", "written"])
@pytest.mark.parametrize("source", ["shards", "raw"])
def test_meta_equals_lerobots(which: str, source: str, request: pytest.FixtureRequest) -> None:
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.utils.feature_utils import dataset_to_policy_features

    ds: Dataset = request.getfixturevalue(which)
    url = str(ds.shards if source == "shards" else ds.raw)
    theirs = LeRobotDatasetMetadata(ds.repo_id, root=ds.raw)
    ours = EpisodePoolDataset(url).meta
    assert ours.features == theirs.features
    assert dataset_to_policy_features(ours.features) == dataset_to_policy_features(theirs.features)
    assert (ours.fps, ours.robot_type, ours.total_episodes, ours.total_frames) == (
        theirs.fps,
        theirs.robot_type,
        theirs.total_episodes,
        theirs.total_frames,
    )
    assert ours.camera_keys == theirs.camera_keys and ours.video_keys == theirs.video_keys
    assert list(ours.tasks) == list(theirs.tasks.index)
    assert sorted(ours.stats) == sorted(theirs.stats)
    for key, stats in theirs.stats.items():
        for name, want in stats.items():
            np.testing.assert_allclose(ours.stats[key][name], want, rtol=2e-6, atol=1e-7, err_msg=f"{key}/{name}")


def _close_stats(ours: dict[str, dict[str, np.ndarray]], want: dict[str, dict[str, np.ndarray]], rtol: float) -> None:
    assert sorted(ours) == sorted(want)
    for key, stats in want.items():
        assert sorted(ours[key]) == sorted(stats), key
        for name, value in stats.items():
            np.testing.assert_allclose(ours[key][name], value, rtol=rtol, atol=1e-12, err_msg=f"{key}/{name}")


@pytest.mark.parametrize("source", ["shards", "raw"])
def test_subset_stats_are_lerobots_aggregate(real: Dataset, source: str) -> None:
    """Over an episode subset, LeRobot's ``aggregate_stats`` of the episodes' meta/episodes stats, from
    the raw source and from its converted shards (whose sidecars carry them)."""
    import pyarrow.parquet as pq
    from lerobot.datasets.compute_stats import aggregate_stats

    table = pq.read_table(next((real.raw / "meta/episodes").rglob("*.parquet")))
    rows = {r["episode_index"]: r for r in table.to_pylist()}
    chosen = [0, 2, 3]
    per_episode = []
    for e in chosen:
        stats: dict[str, dict[str, np.ndarray]] = {}
        for column, value in rows[e].items():
            if column.startswith("stats/"):
                feature, _, name = column[len("stats/") :].rpartition("/")
                stats.setdefault(feature, {})[name] = np.array(value)
        per_episode.append(stats)
    want = aggregate_stats(per_episode)
    url = str(real.shards if source == "shards" else real.raw)
    meta = EpisodePoolDataset(url, episodes=chosen).meta
    assert meta.stats_source == "episodes"
    _close_stats(meta.stats, want, rtol=1e-12)


@pytest.mark.parametrize("source", ["shards", "raw"])
def test_subset_stats_equal_lerobots_own_subset(written: Dataset, source: str, tmp_path) -> None:
    """LeRobot's own subset: ``delete_episodes`` writes a dataset of the kept episodes, whose
    ``LeRobotDatasetMetadata.stats`` LeRobot aggregated; ours over the same episodes equal them."""
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.datasets.dataset_tools import delete_episodes
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    kept = [0, 2]
    delete_episodes(
        LeRobotDataset(written.repo_id, root=written.raw), [1], output_dir=tmp_path / "kept", repo_id="local/kept"
    )
    theirs = LeRobotDatasetMetadata("local/kept", root=tmp_path / "kept")
    assert theirs.total_episodes == len(kept)
    url = str(written.shards if source == "shards" else written.raw)
    ds = EpisodePoolDataset(url, episodes=kept)
    ours = ds.meta
    assert ours.stats_source == "episodes"
    assert theirs.stats["action"]["count"].tolist() == [ds.num_frames] == [40 + 54]  # the kept episodes only
    _close_stats(ours.stats, theirs.stats, rtol=2e-6)  # theirs went through stats.json: float32 rounding allowed
