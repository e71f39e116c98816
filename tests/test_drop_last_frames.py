"""``drop_n_last_frames``: an episode's last frames are never sampled (LeRobot's ``EpisodeAwareSampler``,
Diffusion's 7), every other frame once per epoch on any layout; windows still read the dropped frames;
the resume state records the value. (tests/lerobot/test_sampler_parity.py compares with LeRobot itself.)"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

FPS = 30


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """7 episodes of 12-30 frames, no camera: the order alone is under test."""
    return synth_dataset(
        tmp_path_factory.mktemp("drop") / "ds", num_episodes=7, cameras=(), length_range=(12, 30), seed=3
    )


def _dataset(root: Path, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    kwargs.setdefault("episode_pool_size", 3)
    return EpisodePoolDataset(str(root), **kwargs)


def _keys(loader: DataLoader) -> list[tuple[int, int]]:
    return [k for b in loader for k in zip(b["episode_index"].tolist(), b["frame_index"].tolist())]


def _lengths(root: Path) -> dict[int, int]:
    ds = _dataset(root)
    return {e: n for s in ds.shards for e, n in zip(s.episodes, s.lengths)}


def _sampled(root: Path, drop: int) -> collections.Counter:
    return collections.Counter((e, f) for e, n in _lengths(root).items() for f in range(n - drop))


@pytest.mark.parametrize("drop", [7, 20])  # 20: the episodes of at most 20 frames give no sample
@pytest.mark.parametrize(("world_size", "num_workers"), [(1, 0), (2, 2)])
def test_every_frame_but_the_last_n_exactly_once(raw: Path, drop: int, world_size: int, num_workers: int) -> None:
    seen: collections.Counter = collections.Counter()
    for rank in range(world_size):
        ds = _dataset(
            raw, rank=rank, world_size=world_size, seed=4, drop_n_last_frames=drop, equal_samples_per_rank=False
        )
        seen.update(_keys(DataLoader(ds, batch_size=4, num_workers=num_workers)))
    assert seen == _sampled(raw, drop)
    assert any(n <= drop for n in _lengths(raw).values()) == (drop == 20)


def test_windows_still_read_the_dropped_frames(raw: Path) -> None:
    """An action chunk from the last sampled frame reaches the episode's last frame, unpadded."""
    drop = 7
    ds = _dataset(raw, drop_n_last_frames=drop, delta_timestamps={"action": [i / FPS for i in range(drop + 1)]})
    lengths = _lengths(raw)
    edges = 0
    for batch in DataLoader(ds, batch_size=8):
        for e, f, action, pad in zip(
            batch["episode_index"], batch["frame_index"], batch["action"], batch["action_is_pad"]
        ):
            n = lengths[int(e)]
            assert int(f) < n - drop
            np.testing.assert_allclose(action[:, 0].numpy(), int(e) * 1000 + int(f) + np.arange(drop + 1) + 0.5)
            assert not pad.any()
            edges += int(f) == n - drop - 1
    assert edges == len(lengths)


def test_equal_counts_and_resume_on_the_sampled_frames(raw: Path) -> None:
    """Equal counts split the sampled frames; a resume (same and other worker count) finishes the epoch."""
    drop = 7
    total = sum(_sampled(raw, drop).values())
    kw = dict(seed=6, drop_n_last_frames=drop, world_size=2, equal_samples_per_rank=True)
    for rank in range(2):
        ds = _dataset(raw, rank=rank, **kw)
        full = _keys(DataLoader(ds, batch_size=3, num_workers=2))
        assert len(full) == ds.epoch_samples(2) == total // 2
        state = ds.state_dict(batches_consumed=4, batch_size=3)
        assert state["drop_n_last_frames"] == drop
        again = _dataset(raw, rank=rank, **kw)
        again.load_state_dict(state)
        assert _keys(DataLoader(again, batch_size=3, num_workers=2)) == full[12:]
    ds = _dataset(raw, seed=6, drop_n_last_frames=drop)
    full = _keys(DataLoader(ds, batch_size=3, num_workers=2))
    elastic = _dataset(raw, seed=6, drop_n_last_frames=drop)
    elastic.load_state_dict(ds.state_dict(batches_consumed=5, batch_size=3))
    rest = _keys(DataLoader(elastic, batch_size=3, num_workers=1))  # another worker count
    assert collections.Counter(full[:15] + rest) == _sampled(raw, drop)


def test_resume_state_records_the_value(raw: Path) -> None:
    state = _dataset(raw, drop_n_last_frames=7).state_dict(batches_consumed=2, batch_size=4)
    with pytest.raises(ValueError, match=r"saved with drop_n_last_frames=7 but this dataset has drop_n_last_frames=0"):
        _dataset(raw).load_state_dict(state)
    older = _dataset(raw).state_dict(batches_consumed=2, batch_size=4)
    del older["drop_n_last_frames"]  # a state written before the option: saved with none dropped
    _dataset(raw).load_state_dict(older)
    with pytest.raises(ValueError, match=r"saved with drop_n_last_frames=0 but this dataset has drop_n_last_frames=7"):
        _dataset(raw, drop_n_last_frames=7).load_state_dict(older)


def test_bad_values_are_refused_in_one_line(raw: Path) -> None:
    with pytest.raises(ValueError, match=r"^drop_n_last_frames must be an int >= 0"):
        _dataset(raw, drop_n_last_frames=-1)
    with pytest.raises(ValueError, match=r"^drop_n_last_frames must be an int >= 0"):
        _dataset(raw, drop_n_last_frames=True)
    longest = max(_lengths(raw).values())
    with pytest.raises(ValueError, match=rf"drop_n_last_frames={longest} leaves no frame to sample"):
        _dataset(raw, drop_n_last_frames=longest)
